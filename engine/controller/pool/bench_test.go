package pool

import (
	"context"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// BenchmarkInventory reads the inventory of one upstream of 100,000
// AVAILABLE proxies owned by one worker that holds capacity on 100 of
// them, replacing 1% of the pool between reads (not timed): the provider
// runtime's read on every refill tick.
func BenchmarkInventory(b *testing.B) {
	ctx := context.Background()
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
	c := &ctltest.Churn{Pool: pool, Upstream: "a", Owner: "local", Now: t0}
	if err := c.Fill(ctx, 100_000); err != nil {
		b.Fatal(err)
	}
	w := ctltest.NewWorker()
	for _, id := range c.Live()[50_000:50_100] {
		w.SetCounts(id, 2, 1)
	}
	r := NewInventoryReader(pool, func() map[string]worker.RuntimeReader { return map[string]worker.RuntimeReader{"local": w} })
	now := t0.Add(time.Second)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		inv, err := r.Inventory(ctx, "a", now)
		if err != nil || inv.Available != 100_000 {
			b.Fatalf("inventory = %+v, %v", inv, err)
		}
		b.StopTimer()
		if err := c.Step(ctx, 1000); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkLifecycleTick is one lifecycle tick over 100,000 AVAILABLE
// proxies of which none is due: the loop's cost when there is nothing to
// do.
func BenchmarkLifecycleTick(b *testing.B) {
	ctx := context.Background()
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
	c := &ctltest.Churn{Pool: pool, Upstream: "a", Owner: "local", Now: t0}
	if err := c.Fill(ctx, 100_000); err != nil {
		b.Fatal(err)
	}
	l := New(Options{Store: pool, Now: func() time.Time { return t0.Add(time.Second) }})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if res, err := l.Tick(ctx); err != nil || res.changed() {
			b.Fatalf("tick = %+v, %v", res, err)
		}
	}
}
