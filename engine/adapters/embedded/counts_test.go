package embedded_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// randomOps drives a pool with random operations over a small key space so
// that keys collide, lifecycles end and restart, owners change and
// extractions race: every path that moves an entry between indexes.
type randomOps struct {
	pool  *embedded.Pool
	clock *clock
	keys  []proxy.Proxy // times relative to the zero time: offsets from admission
}

var (
	numStates   = len(proxy.States())
	opUpstreams = []string{"a", "b", "c"}
	opOwners    = []string{"", "w1", "w2", "ghost"}
)

func newRandomOps(pool *embedded.Pool, c *clock, n int, rng *rand.Rand) *randomOps {
	r := &randomOps{pool: pool, clock: c}
	for i := range n {
		exp := time.Time{}.Add(time.Duration(rng.IntN(120)-10) * time.Second)
		p := proxy.Proxy{
			Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: fmt.Sprintf("k%d.example", i), Port: 3128},
			ExpiresAt:      exp,
			UsableUntil:    exp.Add(-time.Duration(rng.IntN(30)) * time.Second),
			MaxConcurrency: int64(rng.IntN(5)), // zero included: never free capacity
			Region:         "eu",
		}
		if i%3 == 0 {
			p.Tags = map[string]string{"tier": "gold"}
		}
		r.keys = append(r.keys, p)
	}
	return r
}

func (r *randomOps) id(rng *rand.Rand) proxy.ID {
	return proxy.MakeID(r.keys[rng.IntN(len(r.keys))].Key)
}

// step performs one random operation. Refusals (conflicts, illegal
// edges, unknown IDs) are part of the exercise and ignored.
func (r *randomOps) step(ctx context.Context, rng *rand.Rand) {
	now := r.clock.Now()
	switch rng.IntN(16) {
	case 0, 1:
		var batch []proxy.Proxy
		for range 1 + rng.IntN(4) {
			p := r.keys[rng.IntN(len(r.keys))]
			p.ExpiresAt = now.Add(p.ExpiresAt.Sub(time.Time{}))
			p.UsableUntil = now.Add(p.UsableUntil.Sub(time.Time{}))
			batch = append(batch, p)
		}
		_, _ = r.pool.Admit(ctx, opUpstreams[rng.IntN(len(opUpstreams))], batch, []int{0, 40}[rng.IntN(2)])
	case 9, 10, 11, 12, 13, 14, 15: // along the lifecycle, so AVAILABLE stays populated
		id := r.id(rng)
		if p, err := r.pool.Get(ctx, id); err == nil {
			switch p.State {
			case proxy.StateFetched:
				_ = r.pool.Transition(ctx, id, p.State, proxy.StateChecking, now)
			case proxy.StateChecking, proxy.StateSuspect:
				_ = r.pool.RecordHealth(ctx, activitypool.Health{ID: id, From: p.State, To: proxy.StateAvailable, CheckedAt: now, Success: true})
			case proxy.StateAvailable:
				_ = r.pool.SetOwner(ctx, []proxy.ID{id}, opOwners[1+rng.IntN(len(opOwners)-1)])
			}
		}
	case 2:
		id := r.id(rng)
		if p, err := r.pool.Get(ctx, id); err == nil {
			to := proxy.States()[rng.IntN(len(proxy.States()))]
			if proxy.Transition(p.State, to) == nil {
				_ = r.pool.Transition(ctx, id, p.State, to, now)
			}
		}
	case 3, 4:
		id := r.id(rng)
		if p, err := r.pool.Get(ctx, id); err == nil {
			to := p.State
			if rng.IntN(2) == 0 {
				to = proxy.States()[rng.IntN(len(proxy.States()))]
			}
			if to == p.State || proxy.Transition(p.State, to) == nil {
				_ = r.pool.RecordHealth(ctx, activitypool.Health{ID: id, From: p.State, To: to, CheckedAt: now, Success: rng.IntN(2) == 0, Latency: time.Millisecond})
			}
		}
	case 5:
		ids := []proxy.ID{r.id(rng), r.id(rng)}
		_ = r.pool.SetOwner(ctx, ids[:1+rng.IntN(2)], opOwners[rng.IntN(len(opOwners))])
	case 6:
		if rng.IntN(3) != 0 {
			return
		}
		req := extraction.Request{Client: "c", Count: 1 + rng.IntN(3), Fulfillment: extraction.Partial, Now: now}
		if rng.IntN(2) == 0 {
			req.Filters.Upstreams = []string{opUpstreams[rng.IntN(len(opUpstreams))]}
		}
		_, _ = r.pool.Extract(ctx, req)
	case 7:
		_ = r.pool.Remove(ctx, r.id(rng))
	case 8:
		if rng.IntN(4) == 0 {
			r.pool.Sweep(now)
		} else {
			r.clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		}
	}
}

// recount is the oracle: everything from a full listing.
func recount(ps []proxy.Proxy, up string, now time.Time, used map[string]map[proxy.ID]int64) (inv upstream.Inventory, free int, slots int64) {
	for i := range ps {
		p := &ps[i]
		if p.Upstream != up {
			continue
		}
		switch p.State {
		case proxy.StateExtracted, proxy.StateExpired, proxy.StateRemoved:
		default:
			inv.Managed++
		}
		if p.State == proxy.StateFetched || p.State == proxy.StateChecking {
			inv.Pending++
		}
		if !p.Usable(now) {
			continue
		}
		inv.Available++
		inv.AvailableSlots += max(p.MaxConcurrency, 0)
		f := p.MaxConcurrency
		if p.Owner != "" {
			m, known := used[p.Owner]
			f = 0
			if known {
				f = p.MaxConcurrency - m[p.ID]
			}
		}
		if p.MaxConcurrency > 0 && f > 0 {
			free++
			slots += f
		}
	}
	return inv, free, slots
}

// feedMirror follows a pool through Changes, re-listing on Reset.
type feedMirror struct {
	states  []proxy.State
	version uint64
	byID    map[proxy.ID]proxy.Proxy
	resets  int
	deltas  int
}

func (m *feedMirror) sync(t *testing.T, ctx context.Context, pool *embedded.Pool) {
	t.Helper()
	ch, err := pool.Changes(ctx, m.version, m.states)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Reset {
		if len(ch.Changed)+len(ch.Gone) > 0 {
			t.Fatal("a Reset carried changes")
		}
		ps, err := pool.List(ctx, activitypool.Filter{States: m.states})
		if err != nil {
			t.Fatal(err)
		}
		m.byID = map[proxy.ID]proxy.Proxy{}
		for _, p := range ps {
			m.byID[p.ID] = p
		}
		m.resets++
	} else {
		if !slices.IsSortedFunc(ch.Changed, func(a, b proxy.Proxy) int { return strings.Compare(string(a.ID), string(b.ID)) }) {
			t.Fatal("Changed not sorted by ID")
		}
		for _, p := range ch.Changed {
			if len(m.states) > 0 && !slices.Contains(m.states, p.State) {
				t.Fatalf("Changed holds %s in %s, not requested", p.ID, p.State)
			}
			m.byID[p.ID] = p
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

// TestIndexesMatchRecountUnderConcurrentOps runs rounds of random
// operations from several goroutines at once; between rounds, every
// maintained figure — Inventory, Counts, FreeCapacity and the mirrors a
// Changes consumer keeps — must equal a recount from a full listing.
func TestIndexesMatchRecountUnderConcurrentOps(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	// A small change log, so that both Changes paths run: deltas after
	// short rounds, Reset after long ones.
	pool := embedded.NewPool(embedded.PoolOptions{Now: c.Now, MaxChangeLog: 128, HardExpiryGrace: 10 * time.Second})
	seed := rand.New(rand.NewPCG(7, 11))
	ops := newRandomOps(pool, c, 120, seed)
	all := &feedMirror{byID: map[proxy.ID]proxy.Proxy{}}
	avail := &feedMirror{states: []proxy.State{proxy.StateAvailable}, byID: map[proxy.ID]proxy.Proxy{}}
	const goroutines = 4
	ownedUsable := 0
	for round := range 300 {
		perG := 1 + seed.IntN([]int{8, 8, 8, 200}[round%4])
		var wg sync.WaitGroup
		for g := range goroutines {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
			wg.Go(func() {
				for range perG {
					ops.step(ctx, rng)
				}
			})
		}
		wg.Wait()

		now := c.Now().Add(time.Duration(seed.IntN(60)-30) * time.Second)
		ps, err := pool.List(ctx, activitypool.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		// Counts on most proxies the known workers own, and on some they
		// do not (stale: another owner, another state, gone).
		used := map[string]map[proxy.ID]int64{"w1": {}, "w2": {}}
		for _, p := range ps {
			if m := used[p.Owner]; m != nil && seed.IntN(4) != 0 {
				m[p.ID] = int64(seed.IntN(6))
			}
		}
		for range 10 {
			used[opOwners[1+seed.IntN(2)]][ops.id(seed)] = int64(seed.IntN(6))
		}
		for _, up := range append(opUpstreams, "unknown") {
			want, wantFree, wantSlots := recount(ps, up, now, used)
			got, err := pool.Inventory(ctx, up, now)
			if err != nil || got != want {
				t.Fatalf("round %d, upstream %s: Inventory = %+v, %v; recount %+v", round, up, got, err, want)
			}
			free, slots, err := pool.FreeCapacity(ctx, up, now, used)
			if err != nil || free != wantFree || slots != wantSlots {
				t.Fatalf("round %d, upstream %s: FreeCapacity = %d, %d, %v; recount %d, %d", round, up, free, slots, err, wantFree, wantSlots)
			}
		}
		counts, _ := pool.Counts(ctx)
		owned := 0 // owned and usable: FreeCapacity's subtraction has work
		for _, p := range ps {
			if p.Owner != "" && p.Usable(now) {
				owned++
			}
		}
		ownedUsable += owned
		wantCounts := map[proxy.State]int{}
		for _, s := range proxy.States() {
			wantCounts[s] = 0
		}
		for _, p := range ps {
			wantCounts[p.State]++
		}
		if !reflect.DeepEqual(counts, wantCounts) {
			t.Fatalf("round %d: Counts = %v, recount %v", round, counts, wantCounts)
		}

		// Filtered listings walk the state lists: the same as filtering a
		// full listing.
		for range 4 {
			f := activitypool.Filter{States: []proxy.State{proxy.States()[seed.IntN(numStates)], proxy.States()[seed.IntN(numStates)]}}
			if seed.IntN(2) == 0 {
				f.Upstream = opUpstreams[seed.IntN(len(opUpstreams))]
			}
			got, err := pool.List(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			want := slices.DeleteFunc(slices.Clone(ps), func(p proxy.Proxy) bool {
				return f.Upstream != "" && p.Upstream != f.Upstream || !slices.Contains(f.States, p.State)
			})
			if !reflect.DeepEqual(got, want) && len(got)+len(want) > 0 {
				t.Fatalf("round %d: List(%+v) = %d proxies, filtering a full listing %d", round, f, len(got), len(want))
			}
		}
		for _, m := range []*feedMirror{all, avail} {
			m.sync(t, ctx, pool)
			want := map[proxy.ID]proxy.Proxy{}
			for _, p := range ps {
				if len(m.states) == 0 || slices.Contains(m.states, p.State) {
					want[p.ID] = p
				}
			}
			if !reflect.DeepEqual(m.byID, want) {
				t.Fatalf("round %d: mirror of %v (%d proxies) differs from a listing (%d)", round, m.states, len(m.byID), len(want))
			}
		}
	}
	if all.resets < 2 || all.deltas < 20 || avail.deltas < 20 || ownedUsable < 500 {
		t.Fatalf("paths not exercised: resets %d, deltas %d/%d, owned usable %d", all.resets, all.deltas, avail.deltas, ownedUsable)
	}
}

// TestChangesReportsEveryWrite pins the change feed per operation: each
// write is reported once as the proxy's state after it, a deletion as
// gone, a read as nothing.
func TestChangesReportsEveryWrite(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	now := c.Now()
	p := embedded.NewPool(embedded.PoolOptions{Now: c.Now})
	v0, _ := p.Changes(ctx, 0, nil)
	if v0.Reset || v0.Version != 0 || len(v0.Changed)+len(v0.Gone) != 0 {
		t.Fatalf("empty pool: %+v", v0)
	}
	ids := available(t, p, "a", now, testProxy("x", now, time.Hour), testProxy("y", now, time.Hour))
	ch, _ := p.Changes(ctx, 0, []proxy.State{proxy.StateAvailable})
	if len(ch.Changed) != 2 || len(ch.Gone) != 0 || ch.Changed[0].State != proxy.StateAvailable {
		t.Fatalf("after admission: %+v", ch)
	}
	v := ch.Version
	_, _ = p.Get(ctx, ids[0])
	_, _ = p.List(ctx, activitypool.Filter{})
	_, _ = p.Inventory(ctx, "a", now)
	if ch, _ := p.Changes(ctx, v, nil); ch.Version != v || len(ch.Changed)+len(ch.Gone) != 0 {
		t.Fatalf("reads were logged: %+v", ch)
	}
	// A health observation without a state change is a change.
	if err := p.RecordHealth(ctx, activitypool.Health{ID: ids[0], From: proxy.StateAvailable, To: proxy.StateAvailable, CheckedAt: now.Add(time.Second), Success: true, Latency: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	ch, _ = p.Changes(ctx, v, []proxy.State{proxy.StateAvailable})
	if len(ch.Changed) != 1 || ch.Changed[0].ID != ids[0] || ch.Changed[0].Latency != 5*time.Millisecond {
		t.Fatalf("after a health pass: %+v", ch)
	}
	v = ch.Version
	if err := p.SetOwner(ctx, ids[1:], "w1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Transition(ctx, ids[0], proxy.StateAvailable, proxy.StateDraining, now); err != nil {
		t.Fatal(err)
	}
	ch, _ = p.Changes(ctx, v, []proxy.State{proxy.StateAvailable})
	if len(ch.Changed) != 1 || ch.Changed[0].Owner != "w1" || !slices.Equal(ch.Gone, ids[:1]) {
		t.Fatalf("after an owner change and a drain: %+v", ch)
	}
	v = ch.Version
	_ = p.Transition(ctx, ids[0], proxy.StateDraining, proxy.StateExpired, now)
	_ = p.Remove(ctx, ids[0])
	ch, _ = p.Changes(ctx, v, nil)
	if len(ch.Changed) != 0 || !slices.Equal(ch.Gone, ids[:1]) {
		t.Fatalf("after removal: %+v", ch)
	}
	if ch, _ := p.Changes(ctx, ch.Version+1, nil); !ch.Reset {
		t.Fatal("a version from the future was not answered with Reset")
	}
}

// TestListLimitKeepsSoonestToExpire: a limited, state-filtered listing
// keeps the proxies closest to their hard expiry, whatever order they
// arrived in, so the lifecycle finds the due ones first.
func TestListLimitKeepsSoonestToExpire(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	now := c.Now()
	p := embedded.NewPool(embedded.PoolOptions{Now: c.Now})
	var ps []proxy.Proxy
	for i, ttl := range []int{50, 10, 40, 30, 20, 60} {
		ps = append(ps, testProxy(fmt.Sprintf("p%d", i), now, time.Duration(ttl)*time.Minute))
	}
	ids := available(t, p, "a", now, ps...)
	available(t, p, "b", now, testProxy("other", now, time.Minute)) // another upstream, sooner still
	got, err := p.List(ctx, activitypool.Filter{Upstream: "a", States: []proxy.State{proxy.StateAvailable}, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := []proxy.ID{ids[1], ids[3], ids[4]} // 10, 30, 20 minutes
	slices.Sort(want)
	var gotIDs []proxy.ID
	for _, x := range got {
		gotIDs = append(gotIDs, x.ID)
	}
	if !slices.Equal(gotIDs, want) {
		t.Fatalf("List with Limit 3 = %v, want the three soonest to expire %v", gotIDs, want)
	}
}
