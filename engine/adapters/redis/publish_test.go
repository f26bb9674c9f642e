package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/distribution"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/testenv"
)

// listOnly hides the pool's change feed: a publisher over it lists the
// pool every round, the full rebuild the feed must equal.
type listOnly struct{ distribution.Store }

// countingPool counts the listings a feed-following publisher makes.
type countingPool struct {
	*redisstore.Pool
	mu    sync.Mutex
	lists int
}

func (c *countingPool) List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.Pool.List(ctx, f)
}

func (c *countingPool) listed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists
}

type noCursors struct{}

func (noCursors) Cursor(context.Context, string) (routing.Cursor, error) {
	return routing.Cursor{}, nil
}

// lastSnapshot is a worker that keeps the last snapshot it was given.
type lastSnapshot struct {
	mu   sync.Mutex
	last *worker.Snapshot
}

func (w *lastSnapshot) Apply(_ context.Context, s *worker.Snapshot) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = s
	return nil
}

func (w *lastSnapshot) Last() *worker.Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// TestPublisherMirrorOverRedis: the snapshot publisher following the Redis
// pool's change feed publishes, round after round, exactly the snapshots
// of a publisher listing the pool every round — with workers (assignment
// included) and without, through ownership moves, health updates, drains,
// extractions, exclusions, time passing and feed resets.
func TestPublisherMirrorOverRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	// A short change log, so that long rounds outrun it and the feed
	// answers Reset.
	pool := newPool(t, client(t, srv), redisstore.Options{MaxChangeLog: 16, HardExpiryGrace: time.Hour})
	feed := &countingPool{Pool: pool}
	rng := rand.New(rand.NewPCG(17, 19))
	now := time.Now().UTC().Truncate(time.Millisecond)
	clock := func() time.Time { return now }
	routingEx := map[string]map[proxy.ID]bool{}
	mk := func(s distribution.Store, workers ...string) (*distribution.Publisher, []*lastSnapshot) {
		p := distribution.New(distribution.Options{Store: s, Cursors: noCursors{}, Now: clock,
			Exclusions: func() map[string]map[proxy.ID]bool { return routingEx }})
		p.SetView(distribution.View{Rules: ctlrouting.Compile([]config.Routing{
			{Name: "r1", Strategy: "leastConnections", Upstreams: []string{"a", "b"}},
			{Name: "r2", Strategy: "leastConnections", Upstreams: []string{"a"}},
		})})
		var ws []*lastSnapshot
		for _, id := range workers {
			w := &lastSnapshot{}
			p.Register(id, w)
			ws = append(ws, w)
		}
		return p, ws
	}
	delta, deltaW := mk(feed, "w1", "w2")
	full, fullW := mk(listOnly{pool}, "w1", "w2")
	soloDelta, _ := mk(feed)
	soloFull, _ := mk(listOnly{pool})
	publishers := []*distribution.Publisher{delta, full, soloDelta, soloFull}

	keys := make([]proxy.Proxy, 120)
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
			var b []proxy.Proxy
			for range 1 + rng.IntN(6) {
				k := keys[rng.IntN(len(keys))]
				k.ExpiresAt = now.Add(time.Duration(20+rng.IntN(300)) * time.Second)
				k.UsableUntil = k.ExpiresAt.Add(-time.Duration(rng.IntN(20)) * time.Second)
				b = append(b, k)
			}
			_, err := pool.Admit(ctx, []string{"a", "b"}[rng.IntN(2)], b, 0)
			opErr(t, "admit", err)
		case 2, 3, 4, 5, 14, 15, 16, 17, 18, 19: // along the lifecycle
			x := id()
			p, err := pool.Get(ctx, x)
			if err != nil {
				return
			}
			switch p.State {
			case proxy.StateFetched:
				err = pool.Transition(ctx, x, p.State, proxy.StateChecking, now)
			case proxy.StateChecking, proxy.StateSuspect:
				err = pool.RecordHealth(ctx, activitypool.Health{ID: x, From: p.State, To: proxy.StateAvailable, CheckedAt: now, Success: true})
			case proxy.StateAvailable:
				switch rng.IntN(4) {
				case 0:
					err = pool.Transition(ctx, x, p.State, proxy.StateDraining, now)
				case 1:
					err = pool.RecordHealth(ctx, activitypool.Health{ID: x, From: p.State, To: proxy.StateSuspect, CheckedAt: now, Fails: 1})
				default: // a pass: only the check fields change
					err = pool.RecordHealth(ctx, activitypool.Health{ID: x, From: p.State, To: p.State, CheckedAt: now, Success: true, Latency: time.Duration(rng.IntN(100)) * time.Millisecond})
				}
			}
			opErr(t, "lifecycle", err)
		case 6:
			opErr(t, "set owner", pool.SetOwner(ctx, []proxy.ID{id()}, []string{"", "w1", "w2", "ghost"}[rng.IntN(4)]))
		case 7:
			_, err := pool.Extract(ctx, extraction.Request{Client: "c", Count: 1 + rng.IntN(2), Fulfillment: extraction.Partial, Now: now})
			opErr(t, "extract", err)
		case 8:
			ids, exclude := []proxy.ID{id()}, rng.IntN(2) == 0
			for _, p := range publishers {
				if exclude {
					p.Exclude(ids)
				} else {
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
			_, err := pool.Sweep(ctx)
			opErr(t, "sweep", err)
		}
	}

	listed, followed, published := 0, 0, 0
	for round := range 200 {
		n := 1 + rng.IntN(8)
		if round%10 == 9 {
			n = 60 + rng.IntN(60)
		}
		for range n {
			step()
		}
		pair := []*distribution.Publisher{delta, full}
		if round%2 == 1 {
			pair[0], pair[1] = full, delta
		}
		before := feed.listed()
		for _, p := range append(pair, soloDelta, soloFull) {
			if err := p.Publish(ctx); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if feed.listed() == before {
			followed++
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
	t.Logf("%d re-listed, %d followed, %d published", listed, followed, published)
	if listed < 5 || followed < 100 || published < 200*5 {
		t.Fatalf("paths not exercised: %d rounds re-listed, %d followed the feed, %d proxies published in all", listed, followed, published)
	}
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
