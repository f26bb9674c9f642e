package pool

import (
	"context"
	"fmt"
	"time"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// InventoryStore is the part of the activity pool the inventory needs.
type InventoryStore interface {
	Inventory(ctx context.Context, upstream string, now time.Time) (upstream.Inventory, error)
	List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error)
}

// CapacityCounter is implemented by a store that computes the free
// capacity below from indexes (the embedded pool); the reader then never
// lists the upstream. used maps every known worker to its active plus
// reserved per proxy; a proxy owned by a worker not in it counts zero.
type CapacityCounter interface {
	FreeCapacity(ctx context.Context, upstream string, now time.Time, used map[string]map[proxy.ID]int64) (available int, slots int64, err error)
}

// DefaultMaxInventoryScan bounds the AVAILABLE proxies one inventory read
// looks at (one upstream's; pool.maxSize is far below it).
const DefaultMaxInventoryScan = 100000

// InventoryReader returns the authoritative inventory of an upstream
// (seed 000 §8): Managed and Pending as the store counts them, Available
// and AvailableSlots from each usable AVAILABLE proxy's real free
// capacity — never "AVAILABLE × a fixed concurrency":
//
//   - unowned (extraction stock): its whole MaxConcurrency;
//   - owned by a worker that reports its runtime: MaxConcurrency minus
//     that worker's active and reserved on it, never below zero;
//   - owned by a worker that is not known here: zero (fail closed).
//
// Available counts the proxies with at least one free slot, so a pool
// saturated by the gateway reads as short and is refilled (within
// maxSize). It is a controller cold path; the gateway never calls it.
//
// A store that is a CapacityCounter answers in O(owners · log n + the
// workers' busy proxies); any other is listed (the upstream's AVAILABLE
// proxies, up to maxScan).
type InventoryReader struct {
	store   InventoryStore
	workers func() map[string]worker.RuntimeReader
	maxScan int
}

// NewInventoryReader returns a reader over store; workers returns every
// known worker by ID (nil: none, so owned proxies count zero).
func NewInventoryReader(store InventoryStore, workers func() map[string]worker.RuntimeReader) *InventoryReader {
	if workers == nil {
		workers = func() map[string]worker.RuntimeReader { return nil }
	}
	return &InventoryReader{store: store, workers: workers, maxScan: DefaultMaxInventoryScan}
}

// Inventory implements the provider runtime's inventory source.
func (r *InventoryReader) Inventory(ctx context.Context, up string, now time.Time) (upstream.Inventory, error) {
	inv, err := r.store.Inventory(ctx, up, now)
	if err != nil {
		return upstream.Inventory{}, err
	}
	used := r.used()
	if c, ok := r.store.(CapacityCounter); ok {
		if inv.Available, inv.AvailableSlots, err = c.FreeCapacity(ctx, up, now, used); err != nil {
			return upstream.Inventory{}, fmt.Errorf("free capacity of %s: %w", up, err)
		}
		return inv, nil
	}
	ps, err := r.store.List(ctx, activitypool.Filter{Upstream: up, States: []proxy.State{proxy.StateAvailable}, Limit: r.maxScan})
	if err != nil {
		return upstream.Inventory{}, fmt.Errorf("listing available proxies of %s: %w", up, err)
	}
	inv.Available, inv.AvailableSlots = 0, 0
	for i := range ps {
		if free := freeSlots(&ps[i], now, used); free > 0 {
			inv.Available++
			inv.AvailableSlots += free
		}
	}
	return inv, nil
}

// used reads every known worker's active and reserved per proxy.
func (r *InventoryReader) used() map[string]map[proxy.ID]int64 {
	used := map[string]map[proxy.ID]int64{}
	for id, w := range r.workers() {
		m := map[proxy.ID]int64{}
		for _, rt := range w.Runtime() {
			m[rt.ID] += rt.Active + rt.Reserved
		}
		used[id] = m
	}
	return used
}

func freeSlots(p *proxy.Proxy, now time.Time, used map[string]map[proxy.ID]int64) int64 {
	if !p.Usable(now) || p.MaxConcurrency <= 0 {
		return 0
	}
	if p.Owner == "" {
		return p.MaxConcurrency
	}
	m, known := used[p.Owner]
	if !known {
		return 0
	}
	return max(p.MaxConcurrency-m[p.ID], 0)
}
