// Package distributiontest checks a store's change feed through the
// snapshot publisher: publishers that follow the feed must publish, round
// after round, exactly what publishers listing the store every round do.
// Every store with an activitypool.ChangeFeed runs it from its tests.
package distributiontest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/distribution"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Pool is a store with a change feed.
type Pool interface {
	activitypool.Pool
	activitypool.ChangeFeed
}

// Case is one store under the check.
type Case struct {
	Pool Pool
	// Now is the clock the store and the publishers read; the check moves
	// it (forward, and back a little).
	Now *time.Time
	// Sweep runs the store's expiry sweep.
	Sweep func(ctx context.Context, now time.Time) error
	// Keys is how many distinct proxies the operations draw from, Rounds
	// how many publish rounds run.
	Keys, Rounds int
	// The check fails unless at least MinListed rounds re-listed (the feed
	// answered Reset), MinFollowed followed the feed, and MinPublished
	// proxies were published in all.
	MinListed, MinFollowed, MinPublished int
}

// FeedEqualsListing runs random operations on c.Pool — new lifecycles,
// checks, drains, ownership moves, extractions, exclusions, routing
// exclusions, time passing and stepping back, sweeps — and publishes after
// each batch, with workers (assignment included) and without. A store
// error other than the ones the operations may meet fails the test.
func FeedEqualsListing(t *testing.T, c Case) {
	t.Helper()
	ctx := context.Background()
	pool := c.Pool
	rng := rand.New(rand.NewPCG(17, 19))
	clock := func() time.Time { return *c.Now }
	feed := &countingPool{Pool: pool}
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

	keys := make([]proxy.Proxy, c.Keys)
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
	opErr := func(what string, err error) {
		if err == nil || errors.Is(err, activitypool.ErrNotFound) || errors.Is(err, activitypool.ErrConflict) ||
			errors.As(err, new(*proxy.TransitionError)) || errors.As(err, new(*extraction.InsufficientError)) {
			return
		}
		t.Errorf("%s: %v", what, err)
	}
	id := func() proxy.ID { return proxy.MakeID(keys[rng.IntN(len(keys))].Key) }
	step := func() {
		now := *c.Now
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
			opErr("admit", err)
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
			opErr("lifecycle", err)
		case 6:
			opErr("set owner", pool.SetOwner(ctx, []proxy.ID{id()}, []string{"", "w1", "w2", "ghost"}[rng.IntN(4)]))
		case 7:
			_, err := pool.Extract(ctx, extraction.Request{Client: "c", Count: 1 + rng.IntN(2), Fulfillment: extraction.Partial, Now: now})
			opErr("extract", err)
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
			*c.Now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		case 12:
			*c.Now = now.Add(-time.Duration(rng.IntN(1000)) * time.Millisecond)
		case 13:
			opErr("sweep", c.Sweep(ctx, now))
		}
	}

	listed, followed, published := 0, 0, 0
	for round := range c.Rounds {
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
				t.Fatalf("round %d, worker %d: delta-built snapshot differs from the full rebuild:\n%s", round, i, DiffSnapshots(got, want))
			}
		}
		if got, want := soloDelta.Last(), soloFull.Last(); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d, no worker: delta-built snapshot differs from the full rebuild:\n%s", round, DiffSnapshots(got, want))
		}
	}
	t.Logf("%d re-listed, %d followed, %d published", listed, followed, published)
	if listed < c.MinListed || followed < c.MinFollowed || published < c.MinPublished {
		t.Fatalf("paths not exercised: %d rounds re-listed, %d followed the feed, %d proxies published in all", listed, followed, published)
	}
}

// DiffSnapshots describes how two snapshots differ, for a failure message.
func DiffSnapshots(got, want *worker.Snapshot) string {
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

// listOnly hides the pool's change feed: a publisher over it lists the
// pool every round, the full rebuild the feed must equal.
type listOnly struct{ distribution.Store }

// countingPool counts the listings a feed-following publisher makes.
type countingPool struct {
	Pool
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
