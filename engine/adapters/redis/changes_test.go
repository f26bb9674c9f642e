package redisstore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// feedOps drives a pool with random operations over a small key space, so
// that keys collide, lifecycles end and restart, owners change and
// extractions take proxies: every script that changes a proxy.
type feedOps struct {
	pool *redisstore.Pool
	keys []proxy.Proxy
	base time.Time
}

var (
	feedUpstreams = []string{"a", "b", "c"}
	feedOwners    = []string{"", "w1", "w2"}
)

func newFeedOps(p *redisstore.Pool, n int, rng *rand.Rand) *feedOps {
	o := &feedOps{pool: p, base: time.Now()}
	for i := range n {
		x := proxy.Proxy{
			Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: uint16(20000 + i), Username: fmt.Sprintf("u%d", i)},
			Password:       "pw",
			MaxConcurrency: int64(1 + i%3),
			Region:         []string{"eu", "us", ""}[i%3],
		}
		if i%5 == 0 {
			x.Tags = map[string]string{"tier": "gold"}
		}
		// Offsets from admission; most lifecycles end (or already ended)
		// within seconds, so that a later admission replaces them.
		x.ExpiresAt = time.Time{}.Add(time.Duration(rng.IntN(20)-5) * time.Second)
		if i%3 == 0 {
			x.ExpiresAt = time.Time{}.Add(10 * time.Minute)
		}
		o.keys = append(o.keys, x)
	}
	return o
}

func (o *feedOps) id(rng *rand.Rand) proxy.ID { return proxy.MakeID(o.keys[rng.IntN(len(o.keys))].Key) }

// step runs one random operation; refusals (conflicts, unknown IDs) are
// part of the mix and change nothing.
func (o *feedOps) step(ctx context.Context, t *testing.T, rng *rand.Rand) {
	now := time.Now()
	switch rng.IntN(15) {
	case 0, 1:
		var b []proxy.Proxy
		for range 1 + rng.IntN(5) {
			x := o.keys[rng.IntN(len(o.keys))]
			x.ExpiresAt = now.Add(x.ExpiresAt.Sub(time.Time{}))
			x.UsableUntil = x.ExpiresAt.Add(-time.Duration(rng.IntN(30)) * time.Second)
			b = append(b, x)
		}
		_, err := o.pool.Admit(ctx, feedUpstreams[rng.IntN(len(feedUpstreams))], b, []int{0, 0, 20}[rng.IntN(3)])
		opErr(t, "admit", err)
	case 2, 3, 4, 12, 13, 14:
		id := o.id(rng)
		p, err := o.pool.Get(ctx, id)
		if err != nil {
			return
		}
		var to proxy.State
		switch p.State {
		case proxy.StateFetched:
			to = proxy.StateChecking
		case proxy.StateChecking, proxy.StateSuspect:
			to = []proxy.State{proxy.StateAvailable, proxy.StateAvailable, proxy.StateUnhealthy}[rng.IntN(3)]
		case proxy.StateAvailable:
			to = []proxy.State{proxy.StateAvailable, proxy.StateAvailable, proxy.StateAvailable, proxy.StateSuspect, proxy.StateDraining, proxy.StateExpired}[rng.IntN(6)]
		case proxy.StateDraining:
			to = proxy.StateRemoved
		default:
			return
		}
		if to == proxy.StateRemoved || to == proxy.StateDraining || to == proxy.StateExpired {
			opErr(t, "transition", o.pool.Transition(ctx, id, p.State, to, now))
			return
		}
		opErr(t, "record health", o.pool.RecordHealth(ctx, activitypool.Health{
			ID: id, From: p.State, To: to, CheckedAt: now, Success: to == proxy.StateAvailable,
			Latency: time.Duration(rng.IntN(100)) * time.Millisecond, Fails: rng.IntN(3),
		}))
	case 5, 6:
		ids := []proxy.ID{o.id(rng), o.id(rng)}
		opErr(t, "set owner", o.pool.SetOwner(ctx, ids[:1+rng.IntN(2)], feedOwners[rng.IntN(len(feedOwners))]))
	case 7:
		if rng.IntN(3) != 0 {
			return
		}
		req := extraction.Request{Client: "c", Count: 1 + rng.IntN(3), Fulfillment: extraction.Partial}
		switch rng.IntN(3) {
		case 0:
			req.Filters.Upstreams = []string{feedUpstreams[rng.IntN(len(feedUpstreams))]}
		case 1:
			req.Filters.Region = "eu"
		}
		_, err := o.pool.Extract(ctx, req)
		opErr(t, "extract", err)
	case 8:
		opErr(t, "remove", o.pool.Remove(ctx, o.id(rng)))
	case 9:
		// A worker's fenced ownership, then its proxies reclaimed.
		l, err := o.pool.GrantOwnerLease(ctx, "lw", time.Minute)
		if errors.Is(err, redisstore.ErrLeaseHeld) {
			return // another goroutine's
		}
		opErr(t, "grant lease", err)
		if err != nil {
			return
		}
		opErr(t, "assign owner", o.pool.AssignOwner(ctx, l, []proxy.ID{o.id(rng)}))
		opErr(t, "release lease", o.pool.ReleaseOwnerLease(ctx, l))
		if rng.IntN(2) == 0 {
			_, _, err := o.pool.ReclaimOwner(ctx, "lw", 10)
			if !errors.Is(err, redisstore.ErrLeaseHeld) { // another goroutine's new lease
				opErr(t, "reclaim", err)
			}
		}
	case 10:
		_, err := o.pool.Sweep(ctx)
		opErr(t, "sweep", err)
	case 11: // reads change nothing
		_, _ = o.pool.Inventory(ctx, feedUpstreams[rng.IntN(len(feedUpstreams))], time.Time{})
		_, _ = o.pool.Counts(ctx)
	}
}

// opErr fails on errors other than the refusals random operations meet.
func opErr(t *testing.T, what string, err error) {
	if err == nil || errors.Is(err, activitypool.ErrNotFound) || errors.Is(err, activitypool.ErrConflict) ||
		errors.As(err, new(*proxy.TransitionError)) || errors.As(err, new(*extraction.InsufficientError)) {
		return
	}
	t.Errorf("%s: %v", what, err)
}

// feedMirror follows a pool through Changes, re-listing on Reset.
type feedMirror struct {
	states  []proxy.State
	version uint64
	byID    map[proxy.ID]proxy.Proxy
	resets  int
	deltas  int
}

func (m *feedMirror) sync(ctx context.Context, t *testing.T, p *redisstore.Pool) {
	t.Helper()
	ch, err := p.Changes(ctx, m.version, m.states)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Reset {
		if len(ch.Changed)+len(ch.Gone) > 0 {
			t.Fatal("a Reset carried changes")
		}
		ps, err := p.List(ctx, activitypool.Filter{States: m.states})
		if err != nil {
			t.Fatal(err)
		}
		m.byID = map[proxy.ID]proxy.Proxy{}
		for _, x := range ps {
			m.byID[x.ID] = x
		}
		m.resets++
	} else {
		if !slices.IsSortedFunc(ch.Changed, func(a, b proxy.Proxy) int { return cmp.Compare(a.ID, b.ID) }) {
			t.Fatal("Changed not sorted by ID")
		}
		for _, x := range ch.Changed {
			if len(m.states) > 0 && !slices.Contains(m.states, x.State) {
				t.Fatalf("Changed holds %s in %s, not requested", x.ID, x.State)
			}
			m.byID[x.ID] = x
		}
		for _, id := range ch.Gone {
			delete(m.byID, id)
		}
		if len(ch.Changed)+len(ch.Gone) > 0 {
			m.deltas++
		}
	}
	m.version = ch.Version
}

// check compares the mirror with a listing.
func (m *feedMirror) check(ctx context.Context, t *testing.T, p *redisstore.Pool, when string) {
	t.Helper()
	ps, err := p.List(ctx, activitypool.Filter{States: m.states})
	if err != nil {
		t.Fatal(err)
	}
	want := map[proxy.ID]proxy.Proxy{}
	for _, x := range ps {
		want[x.ID] = x
	}
	if !reflect.DeepEqual(m.byID, want) {
		var diff []string
		for _, id := range slices.Sorted(maps.Keys(want)) {
			if got, ok := m.byID[id]; !ok || !reflect.DeepEqual(got, want[id]) {
				diff = append(diff, fmt.Sprintf("%s: mirror %v (%s, owner %q), listed %s owner %q", id, ok, got.State, got.Owner, want[id].State, want[id].Owner))
			}
		}
		for id := range m.byID {
			if _, ok := want[id]; !ok {
				diff = append(diff, fmt.Sprintf("%s: in the mirror (%s), not listed", id, m.byID[id].State))
			}
		}
		t.Fatalf("%s: mirror of %v differs from a listing:\n%v", when, m.states, diff)
	}
}

// TestChangesMirrorEqualsListing runs random operation sequences; mirrors
// kept only through Changes (and List on Reset) must equal a listing of
// their states after every step they sync: one syncing after every step,
// one of two states, one of every state, and one lagging far enough
// behind that the short change log answers Reset.
func TestChangesMirrorEqualsListing(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	// No key expires during the test (expiry has a test of its own); a
	// log shorter than the key space, so the lagging mirror outruns it.
	p := newPool(t, rdb, redisstore.Options{MaxChangeLog: 15, HardExpiryGrace: time.Hour})
	rng := rand.New(rand.NewPCG(3, 5))
	ops := newFeedOps(p, 40, rng)
	avail := &feedMirror{states: []proxy.State{proxy.StateAvailable}}
	two := &feedMirror{states: []proxy.State{proxy.StateExtracted, proxy.StateFetched}}
	all := &feedMirror{}
	lag := &feedMirror{states: []proxy.State{proxy.StateAvailable}}
	next, most := 0, 0
	for step := range 1500 {
		ops.step(ctx, t, rng)
		for _, m := range []*feedMirror{avail, two, all} {
			m.sync(ctx, t, p)
			m.check(ctx, t, p, fmt.Sprintf("step %d", step))
		}
		most = max(most, len(avail.byID))
		if step == next {
			lag.sync(ctx, t, p)
			lag.check(ctx, t, p, fmt.Sprintf("step %d, lagging", step))
			next = step + 1 + rng.IntN([]int{3, 200}[rng.IntN(2)])
		}
	}
	t.Logf("available %d deltas %d resets (at most %d proxies), all %d/%d, lagging %d/%d", avail.deltas, avail.resets, most, all.deltas, all.resets, lag.deltas, lag.resets)
	if avail.deltas < 200 || two.deltas < 200 || all.deltas < 200 || lag.resets < 3 || lag.deltas < 3 || avail.resets != 1 || most < 8 {
		t.Fatalf("paths not exercised: available %d deltas %d resets (at most %d proxies), two states %d deltas, all %d deltas, lagging %d deltas %d resets",
			avail.deltas, avail.resets, most, two.deltas, all.deltas, lag.deltas, lag.resets)
	}
}

// TestChangesConcurrentWritesNotMissed: mirrors sync over and over while
// goroutines change the pool; once the writers stop, one more sync must
// equal a listing — a change made while Changes ran is never lost.
func TestChangesConcurrentWritesNotMissed(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	p := newPool(t, rdb, redisstore.Options{HardExpiryGrace: time.Hour})
	ops := newFeedOps(p, 60, rand.New(rand.NewPCG(9, 1)))
	avail := &feedMirror{states: []proxy.State{proxy.StateAvailable}}
	all := &feedMirror{}
	for round := range 20 {
		var wg sync.WaitGroup
		done := make(chan struct{})
		for g := range 3 {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
			wg.Go(func() {
				for range 40 {
					ops.step(ctx, t, rng)
				}
			})
		}
		go func() { wg.Wait(); close(done) }()
		for running := true; running; {
			select {
			case <-done:
				running = false
			default:
			}
			avail.sync(ctx, t, p)
			all.sync(ctx, t, p)
		}
		for _, m := range []*feedMirror{avail, all} {
			m.sync(ctx, t, p)
			m.check(ctx, t, p, fmt.Sprintf("round %d", round))
		}
	}
	if avail.deltas < 20 || all.deltas < 20 {
		t.Fatalf("paths not exercised: %d and %d deltas", avail.deltas, all.deltas)
	}
}

// TestChangesReset pins when Changes answers Reset: version 0, a version
// not handed out, one trimmed from the log, more changed proxies than
// MaxList, and Redis flushed or restarted (a new generation) — even once
// the new generation's counter passed the old version.
func TestChangesReset(t *testing.T) {
	ctx := context.Background()
	avail := []proxy.State{proxy.StateAvailable}
	changes := func(t *testing.T, p *redisstore.Pool, since uint64) activitypool.Changes {
		t.Helper()
		ch, err := p.Changes(ctx, since, avail)
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}

	t.Run("Versions", func(t *testing.T) {
		srv := testenv.StartRedis(t)
		p := newPool(t, client(t, srv), redisstore.Options{})
		ch := changes(t, p, 0)
		if !ch.Reset || ch.Version == 0 {
			t.Fatalf("since 0: %+v, want Reset with a version", ch)
		}
		if again := changes(t, p, ch.Version); again.Reset || again.Version != ch.Version {
			t.Fatalf("nothing changed: %+v, want no Reset at %d", again, ch.Version)
		}
		if ahead := changes(t, p, ch.Version+1); !ahead.Reset {
			t.Fatalf("since a version not handed out: %+v, want Reset", ahead)
		}
		ids := available(t, p, "a", batch("v", 3, time.Now())...)
		got := changes(t, p, ch.Version)
		if got.Reset || got.Version <= ch.Version || len(got.Changed) != 3 || len(got.Gone) != 0 {
			t.Fatalf("after 3 became AVAILABLE: %+v", got)
		}
		must(t, p.SetOwner(ctx, ids[:1], "w1"))
		must(t, p.Transition(ctx, ids[1], proxy.StateAvailable, proxy.StateDraining, time.Now()))
		last := changes(t, p, got.Version)
		if last.Reset || len(last.Changed) != 1 || last.Changed[0].Owner != "w1" || !slices.Equal(last.Gone, ids[1:2]) {
			t.Fatalf("after an owner change and a drain: %+v", last)
		}
	})

	t.Run("Trimmed", func(t *testing.T) {
		srv := testenv.StartRedis(t)
		p := newPool(t, client(t, srv), redisstore.Options{MaxChangeLog: 10})
		v0 := changes(t, p, 0).Version
		ids := available(t, p, "a", batch("trim", 11, time.Now())...)
		if ch := changes(t, p, v0); !ch.Reset {
			t.Fatalf("11 proxies changed past a log of 10: %+v, want Reset", ch)
		}
		v1 := changes(t, p, 0).Version
		for _, id := range ids[:10] {
			must(t, p.SetOwner(ctx, []proxy.ID{id}, "w1"))
		}
		if ch := changes(t, p, v1); ch.Reset || len(ch.Changed) != 10 {
			t.Fatalf("10 proxies changed in a log of 10: %+v, want them", ch)
		}
		// Sweep trims as well: a log of 11 distinct proxies drops one.
		v2 := changes(t, p, 0).Version
		for _, id := range ids {
			must(t, p.RecordHealth(ctx, activitypool.Health{ID: id, From: proxy.StateAvailable, To: proxy.StateAvailable, CheckedAt: time.Now(), Success: true}))
		}
		if _, err := p.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		n, err := p.Client().ZCard(ctx, redisstore.KeyPrefix(p)+"changes").Result()
		if err != nil || n != 10 {
			t.Fatalf("log after Sweep: %d entries, %v; want 10", n, err)
		}
		if ch := changes(t, p, v2); !ch.Reset {
			t.Fatalf("after Sweep trimmed: %+v, want Reset", ch)
		}
	})

	t.Run("MoreThanMaxList", func(t *testing.T) {
		srv := testenv.StartRedis(t)
		p := newPool(t, client(t, srv), redisstore.Options{MaxList: 5, MaxChangeLog: 100})
		v0 := changes(t, p, 0).Version
		available(t, p, "a", batch("five", 5, time.Now())...)
		ch := changes(t, p, v0)
		if ch.Reset || len(ch.Changed) != 5 {
			t.Fatalf("5 changed, MaxList 5: %+v, want them", ch)
		}
		available(t, p, "a", batch("six", 6, time.Now())...)
		if ch := changes(t, p, ch.Version); !ch.Reset {
			t.Fatalf("6 changed, MaxList 5: %+v, want Reset", ch)
		}
	})

	for _, c := range []struct {
		name string
		lose func(t *testing.T, srv *testenv.Redis, p *redisstore.Pool)
		// noticed: another operation of the same pool adopts the new
		// generation before Changes runs.
		noticed bool
	}{
		{"Flushed", func(t *testing.T, srv *testenv.Redis, p *redisstore.Pool) {
			must(t, p.Client().FlushAll(ctx).Err())
		}, false},
		{"FlushedNoticedFirst", func(t *testing.T, srv *testenv.Redis, p *redisstore.Pool) {
			must(t, p.Client().FlushAll(ctx).Err())
		}, true},
		{"Restarted", func(t *testing.T, srv *testenv.Redis, p *redisstore.Pool) { srv.Restart() }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := testenv.StartRedis(t)
			p := newPool(t, client(t, srv), redisstore.Options{})
			available(t, p, "a", batch("old", 3, time.Now())...)
			v := changes(t, p, 0).Version
			c.lose(t, srv, p)
			// Another process refills the new generation past the old
			// version's counter.
			other := newPool(t, client(t, srv), redisstore.Options{Namespace: p.Namespace()})
			for i := range 3 {
				available(t, other, "a", batch(fmt.Sprintf("new%d", i), 3, time.Now())...)
			}
			if c.noticed {
				if _, err := p.Counts(ctx); !errors.Is(err, activitypool.ErrStateLost) {
					t.Fatalf("counts after the loss: %v, want ErrStateLost", err)
				}
			}
			ch := changes(t, p, v)
			if !ch.Reset || ch.Version <= v {
				t.Fatalf("after the state was lost: %+v, want Reset past %d", ch, v)
			}
			if next := changes(t, p, ch.Version); next.Reset {
				t.Fatalf("following the new generation: %+v", next)
			}
		})
	}
}

// TestChangesReportsExpiredKeys: a proxy whose key Redis expired is
// reported gone, whether Changes or Sweep drops it from the indexes.
func TestChangesReportsExpiredKeys(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	for _, sweepFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("sweepFirst=%v", sweepFirst), func(t *testing.T) {
			p := newPool(t, rdb, redisstore.Options{HardExpiryGrace: time.Millisecond})
			m := &feedMirror{states: []proxy.State{proxy.StateAvailable}}
			m.sync(ctx, t, p)
			now := time.Now()
			short := batch("short", 3, now)
			for i := range short {
				short[i].ExpiresAt, short[i].UsableUntil = now.Add(2*time.Second), now.Add(time.Second)
			}
			available(t, p, "a", short...)
			long := available(t, p, "a", px("long", now, time.Hour))
			m.sync(ctx, t, p)
			if len(m.byID) != 4 {
				t.Fatalf("mirror holds %d proxies, want 4", len(m.byID))
			}
			eventually(t, 10*time.Second, "short-lived keys expire", func() bool {
				ps, err := p.List(ctx, activitypool.Filter{States: m.states})
				return err == nil && len(ps) == 1
			})
			if sweepFirst {
				res, err := p.Sweep(ctx)
				if err != nil || res.Ghosts < 3 {
					t.Fatalf("sweep: %+v, %v; want the 3 expired dropped", res, err)
				}
			}
			m.sync(ctx, t, p)
			if !slices.Equal(slices.Collect(maps.Keys(m.byID)), long) || m.resets != 1 {
				t.Fatalf("mirror after expiry: %v (%d resets), want only %v", slices.Collect(maps.Keys(m.byID)), m.resets, long)
			}
		})
	}
}
