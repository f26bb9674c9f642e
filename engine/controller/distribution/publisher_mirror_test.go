package distribution

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"
	"weak"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// listOnly hides the embedded pool's change feed: a publisher over it
// lists the pool every round, the full rebuild the feed must equal.
type listOnly struct{ Store }

// countingFeed counts the listings a feed-following publisher makes.
type countingFeed struct {
	*embedded.Pool
	lists int
}

func (c *countingFeed) List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error) {
	c.lists++
	return c.Pool.List(ctx, f)
}

// TestDeltaPublishEqualsFullRebuild runs random operation sequences on a
// pool and publishes after each: snapshots built by following the change
// feed must equal, field for field, those built from a full listing —
// with workers (assignment included) and without, through exclusions,
// ownership moves, health updates, drains, extractions, time passing
// (and stepping back) and feed resets.
func TestDeltaPublishEqualsFullRebuild(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(17, 19))
	now := t0
	clock := func() time.Time { return now }
	// A small change log, so that long rounds outrun it and the feed
	// answers Reset.
	pool := embedded.NewPool(embedded.PoolOptions{Now: clock, MaxChangeLog: 32})
	feed := &countingFeed{Pool: pool}
	routingEx := map[string]map[proxy.ID]bool{}
	mk := func(s Store, workers ...string) (*Publisher, []*ctltest.Worker) {
		p := New(Options{Store: s, Cursors: &flakyCursors{}, Now: clock,
			Exclusions: func() map[string]map[proxy.ID]bool { return routingEx }})
		p.SetView(View{Rules: ctlrouting.Compile([]config.Routing{
			{Name: "r1", Strategy: "leastConnections", Upstreams: []string{"a", "b"}},
			{Name: "r2", Strategy: "leastConnections", Upstreams: []string{"a"}},
		})})
		var ws []*ctltest.Worker
		for _, id := range workers {
			w := ctltest.NewWorker()
			p.Register(id, w)
			ws = append(ws, w)
		}
		return p, ws
	}
	delta, deltaW := mk(feed, "w1", "w2")
	full, fullW := mk(listOnly{pool}, "w1", "w2")
	soloDelta, _ := mk(feed)
	soloFull, _ := mk(listOnly{pool})

	keys := make([]proxy.Proxy, 150)
	for i := range keys {
		keys[i] = proxy.Proxy{
			Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: uint16(30000 + i), Username: fmt.Sprintf("u%d", i)},
			Password:       "pw",
			MaxConcurrency: int64(1 + i%4),
			Region:         "eu",
		}
		if i%4 == 0 {
			keys[i].Tags = map[string]string{"tier": "gold"}
		}
	}
	id := func() proxy.ID { return proxy.MakeID(keys[rng.IntN(len(keys))].Key) }
	step := func() {
		switch rng.IntN(20) {
		case 0, 1: // new lifecycles
			var batch []proxy.Proxy
			for range 1 + rng.IntN(6) {
				k := keys[rng.IntN(len(keys))]
				k.ExpiresAt = now.Add(time.Duration(20+rng.IntN(300)) * time.Second)
				k.UsableUntil = k.ExpiresAt.Add(-time.Duration(rng.IntN(20)) * time.Second)
				batch = append(batch, k)
			}
			_, _ = pool.Admit(ctx, []string{"a", "b"}[rng.IntN(2)], batch, 0)
		case 2, 3, 4, 5, 14, 15, 16, 17, 18, 19: // along the lifecycle
			x := id()
			if p, err := pool.Get(ctx, x); err == nil {
				switch p.State {
				case proxy.StateFetched:
					_ = pool.Transition(ctx, x, p.State, proxy.StateChecking, now)
				case proxy.StateChecking, proxy.StateSuspect:
					_ = pool.RecordHealth(ctx, activitypool.Health{ID: x, From: p.State, To: proxy.StateAvailable, CheckedAt: now, Success: true})
				case proxy.StateAvailable:
					switch rng.IntN(4) {
					case 0:
						_ = pool.Transition(ctx, x, p.State, proxy.StateDraining, now)
					case 1:
						_ = pool.RecordHealth(ctx, activitypool.Health{ID: x, From: p.State, To: proxy.StateSuspect, CheckedAt: now, Fails: 1})
					default: // a pass: only the check fields change
						_ = pool.RecordHealth(ctx, activitypool.Health{ID: x, From: p.State, To: p.State, CheckedAt: now, Success: true, Latency: time.Duration(rng.IntN(100)) * time.Millisecond})
					}
				}
			}
		case 6:
			_ = pool.SetOwner(ctx, []proxy.ID{id()}, []string{"", "w1", "w2", "ghost"}[rng.IntN(4)])
		case 7:
			_, _ = pool.Extract(ctx, extractReq(rng, now))
		case 8:
			ids := []proxy.ID{id()}
			if rng.IntN(2) == 0 {
				for _, p := range []*Publisher{delta, full, soloDelta, soloFull} {
					p.Exclude(ids)
				}
			} else {
				for _, p := range []*Publisher{delta, full, soloDelta, soloFull} {
					p.Include(ids)
				}
			}
		case 9:
			r := []string{"r1", "r2", "gone"}[rng.IntN(3)]
			if routingEx[r] == nil || rng.IntN(3) == 0 {
				routingEx[r] = map[proxy.ID]bool{}
			}
			routingEx[r][id()] = rng.IntN(5) != 0
		case 10, 11:
			now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		case 12:
			now = now.Add(-time.Duration(rng.IntN(1000)) * time.Millisecond)
		case 13:
			pool.Sweep(now)
		}
	}

	listed, deltaRounds, published := 0, 0, 0
	for round := range 400 {
		n := 1 + rng.IntN(8)
		if round%10 == 9 {
			n = 60 + rng.IntN(60)
		}
		for range n {
			step()
		}
		pair := []*Publisher{delta, full}
		if round%2 == 1 {
			pair[0], pair[1] = full, delta
		}
		before := feed.lists
		for _, p := range append(pair, soloDelta, soloFull) {
			if err := p.Publish(ctx); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if feed.lists == before {
			deltaRounds++
		} else {
			listed++
		}
		published += len(soloDelta.Last().Proxies)
		for i := range deltaW {
			if got, want := deltaW[i].Last(), fullW[i].Last(); !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d, worker %d: delta-built snapshot differs from the full rebuild:\n%s", round, i, diffSnapshots(got, want))
			}
		}
		if got, want := soloDelta.Last(), soloFull.Last(); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d, no worker: delta-built snapshot differs from the full rebuild:\n%s", round, diffSnapshots(got, want))
		}
	}
	t.Logf("%d re-listed, %d followed, %d published", listed, deltaRounds, published)
	if listed < 5 || deltaRounds < 200 || published < 400*10 {
		t.Fatalf("paths not exercised: %d rounds re-listed, %d followed the feed, %d proxies published in all", listed, deltaRounds, published)
	}
}

func extractReq(rng *rand.Rand, now time.Time) extraction.Request {
	return extraction.Request{Client: "c", Count: 1 + rng.IntN(2), Fulfillment: extraction.Partial, Now: now}
}

func diffSnapshots(got, want *worker.Snapshot) string {
	if got == nil || want == nil {
		return fmt.Sprintf("got %v, want %v", got, want)
	}
	ids := func(s *worker.Snapshot) []proxy.ID {
		var out []proxy.ID
		for i := range s.Proxies {
			out = append(out, s.Proxies[i].ID)
		}
		return out
	}
	return fmt.Sprintf("version %d/%d\nproxies %v\nwant    %v\nexclusions %v\nwant       %v",
		got.Version, want.Version, ids(got), ids(want), got.RoutingExclusions, want.RoutingExclusions)
}

// TestMirrorReleasesOldLists: the mirror points into the published lists
// instead of keeping a copy of its own; once a list is replaced nothing of
// the publisher may keep it alive, not even through a proxy the new list
// leaves out.
func TestMirrorReleasesOldLists(t *testing.T) {
	pool, ids := setup(t, 8)
	ctx := context.Background()
	w := ctltest.NewWorker()
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 }})
	p.Register("local", w)
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	old := weak.Make(&w.Last().Proxies[0])
	p.Exclude(ids[:1]) // left out of the next list
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if len(w.Last().Proxies) != len(ids)-1 {
		t.Fatalf("published %d proxies, want %d", len(w.Last().Proxies), len(ids)-1)
	}
	for range 3 {
		runtime.GC()
	}
	if old.Value() != nil {
		t.Fatal("the replaced list is still reachable")
	}
	runtime.KeepAlive(p)
}

// missingFeed is a change feed that never reports one proxy's changes, as
// a store rolled back past a version and written over it would not.
type missingFeed struct {
	*embedded.Pool
	hide proxy.ID
}

func (f missingFeed) Changes(ctx context.Context, since uint64, states []proxy.State) (activitypool.Changes, error) {
	ch, err := f.Pool.Changes(ctx, since, states)
	ch.Changed = slices.DeleteFunc(ch.Changed, func(p proxy.Proxy) bool { return p.ID == f.hide })
	ch.Gone = slices.DeleteFunc(ch.Gone, func(id proxy.ID) bool { return id == f.hide })
	return ch, err
}

// A mirror following a feed lists the store again every relistEvery, so
// what the feed missed is put right.
func TestMirrorRelistsPeriodically(t *testing.T) {
	pool, ids := setup(t, 4)
	ctx := context.Background()
	now := t0
	m := newMirror(missingFeed{Pool: pool, hide: ids[0]}, 100)
	m.now = func() time.Time { return now }
	has := func(id proxy.ID) bool {
		return slices.ContainsFunc(m.sorted, func(s slot) bool { return s.p.ID == id })
	}
	if err := m.sync(ctx); err != nil || !has(ids[0]) || len(m.sorted) != 4 {
		t.Fatalf("first sync: %d proxies, %v", len(m.sorted), err)
	}
	if err := pool.Transition(ctx, ids[0], proxy.StateAvailable, proxy.StateSuspect, t0); err != nil {
		t.Fatal(err)
	}
	now = now.Add(relistEvery - time.Second)
	if err := m.sync(ctx); err != nil || !has(ids[0]) {
		t.Fatalf("the feed was to hide the change: has %v, %v", has(ids[0]), err)
	}
	now = now.Add(time.Second)
	if err := m.sync(ctx); err != nil || has(ids[0]) || len(m.sorted) != 3 {
		t.Fatalf("after relistEvery: still has %s: %v (%d proxies, %v)", ids[0], has(ids[0]), len(m.sorted), err)
	}
}
