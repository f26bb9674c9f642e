package pool

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

func TestInventorySubtractsWorkerCapacityAndOwnership(t *testing.T) {
	ctx := context.Background()
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
	// Six AVAILABLE proxies of upstream a, maxConcurrency 4 each.
	ids, err := ctltest.AddAvailable(ctx, pool, "a", 6, 100, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctltest.AddAvailable(ctx, pool, "a", 1, 200, t0, 5*time.Second); err != nil { // past its usable period below
		t.Fatal(err)
	}
	if _, err := ctltest.AddAvailable(ctx, pool, "b", 3, 300, t0, time.Hour); err != nil { // another upstream
		t.Fatal(err)
	}
	// A pending one.
	key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: 400}
	if _, err := pool.Admit(ctx, "a", []proxy.Proxy{{Key: key, ExpiresAt: t0.Add(time.Hour), MaxConcurrency: 4}}, 0); err != nil {
		t.Fatal(err)
	}
	w := ctltest.NewWorker()
	for owner, ps := range map[string][]proxy.ID{"w1": {ids[1], ids[2], ids[3]}, "ghost": {ids[4]}} {
		if err := pool.SetOwner(ctx, ps, owner); err != nil {
			t.Fatal(err)
		}
	}
	w.SetCounts(ids[1], 1, 1) // 2 of 4 free
	w.SetCounts(ids[2], 3, 1) // saturated
	w.SetCounts(ids[5], 2, 0) // unowned: a stale count from a revoked allocation does not count
	now := t0.Add(10 * time.Second)
	r := NewInventoryReader(pool, func() map[string]worker.RuntimeReader { return map[string]worker.RuntimeReader{"w1": w} })
	got, err := r.Inventory(ctx, "a", now)
	if err != nil {
		t.Fatal(err)
	}
	// unowned ids[0], ids[5]: 4+4; w1: ids[1] 2, ids[2] 0, ids[3] 4; ghost ids[4]: 0 (unknown worker).
	want := upstream.Inventory{Managed: 8, Available: 4, AvailableSlots: 14, Pending: 1}
	if got != want {
		t.Fatalf("inventory = %+v, want %+v", got, want)
	}
	raw, _ := pool.Inventory(ctx, "a", now)
	if raw.AvailableSlots == got.AvailableSlots {
		t.Fatal("the store's count already matched: the test does not show the subtraction")
	}
	// No known worker: every owned proxy is zero capacity.
	got, err = NewInventoryReader(pool, nil).Inventory(ctx, "a", now)
	if err != nil || got.Available != 2 || got.AvailableSlots != 8 {
		t.Fatalf("without workers = %+v, %v", got, err)
	}
}

// listOnly hides the embedded pool's FreeCapacity: the reader lists, as it
// does over a store without capacity indexes.
type listOnly struct{ InventoryStore }

// TestInventoryIndexedMatchesListing compares the reader over the
// embedded pool's capacity indexes with the reader over a listing of the
// same pool, through random ownership, worker counts, drains and times.
func TestInventoryIndexedMatchesListing(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 5))
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
	var ids []proxy.ID
	for i := range 30 {
		got, err := ctltest.AddAvailable(ctx, pool, []string{"a", "b"}[i%2], 10, 1000+10*i, t0, time.Duration(1+rng.IntN(120))*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	w1, w2 := ctltest.NewWorker(), ctltest.NewWorker()
	workers := func() map[string]worker.RuntimeReader { return map[string]worker.RuntimeReader{"w1": w1, "w2": w2} }
	indexed, listed := NewInventoryReader(pool, workers), NewInventoryReader(listOnly{pool}, workers)
	owned := 0
	for round := range 200 {
		id := ids[rng.IntN(len(ids))]
		switch rng.IntN(4) {
		case 0:
			if pool.SetOwner(ctx, []proxy.ID{id}, []string{"w1", "w2", "ghost"}[rng.IntN(3)]) == nil {
				owned++
			}
		case 1:
			_ = pool.SetOwner(ctx, []proxy.ID{id}, "")
		case 2:
			[]*ctltest.Worker{w1, w2}[rng.IntN(2)].SetCounts(id, int64(rng.IntN(4)), int64(rng.IntN(3)))
		case 3:
			_ = pool.Transition(ctx, id, proxy.StateAvailable, proxy.StateDraining, t0)
		}
		now := t0.Add(time.Duration(rng.IntN(130)) * time.Second)
		for _, up := range []string{"a", "b"} {
			got, err1 := indexed.Inventory(ctx, up, now)
			want, err2 := listed.Inventory(ctx, up, now)
			if err1 != nil || err2 != nil || got != want {
				t.Fatalf("round %d, %s at +%s: indexed %+v (%v), listed %+v (%v)", round, up, now.Sub(t0), got, err1, want, err2)
			}
		}
	}
	if owned < 20 {
		t.Fatalf("only %d ownership changes: the test did not exercise owned proxies", owned)
	}
}

var _ CapacityCounter = (*embedded.Pool)(nil)
