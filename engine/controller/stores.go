package controller

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/controller/internal/loop"
)

// Store probing: readiness does not follow the stores (a gateway with a
// usable snapshot keeps serving through an outage, seed 000 §18), so their
// reachability is reported in the admin status and as metrics instead.
const (
	storeProbeEvery   = 5 * time.Second
	storeProbeTimeout = 3 * time.Second
)

// Store names, as the admin status and the store label say them.
const (
	storeActivityPool = "activitypool"
	storeManagement   = "management"
)

// pinger is a store that can tell whether its server answers; the cluster
// stores implement it, the embedded ones need not (they are in process).
type pinger interface {
	Ping(ctx context.Context) error
}

// generations is an activity pool that can lose its state (Redis) and
// counts the times it found it lost.
type generations interface {
	GenerationChanges() uint64
}

// storeProbe remembers the last probe of each store and exports it.
type storeProbe struct {
	log  *slog.Logger
	mu   sync.Mutex
	last map[string]StoreStatus
	up   *prometheus.GaugeVec
}

func newStoreProbe(reg *prometheus.Registry, log *slog.Logger, pool any) *storeProbe {
	p := &storeProbe{
		log:  log,
		last: map[string]StoreStatus{},
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "store", Name: "up",
			Help: "Whether the store answered its last probe (1) or not (0).",
		}, []string{"store"}),
	}
	if reg == nil {
		return p
	}
	reg.MustRegister(p.up)
	if g, ok := pool.(generations); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "store", Name: "generation_changes_total",
			Help: "Times the activity pool store (Redis) was found to have lost its state, since start.",
		}, func() float64 { return float64(g.GenerationChanges()) }))
	}
	return p
}

// record notes one store's outcome; err nil means it answered.
func (p *storeProbe) record(store string, err error, at time.Time) StoreStatus {
	s := StoreStatus{Reachable: err == nil, CheckedAt: at}
	if err != nil {
		s.Error = err.Error()
	}
	p.mu.Lock()
	prev, seen := p.last[store]
	p.last[store] = s
	p.mu.Unlock()
	// An outage is logged when it starts and when it ends, not per probe.
	switch {
	case !s.Reachable && (!seen || prev.Reachable):
		p.log.Warn("store unreachable", "store", store, "err", err)
	case s.Reachable && seen && !prev.Reachable:
		p.log.Info("store reachable again", "store", store)
	}
	v := 0.0
	if s.Reachable {
		v = 1
	}
	p.up.WithLabelValues(store).Set(v)
	return s
}

// ping probes one store within storeProbeTimeout.
func ping(ctx context.Context, store any) error {
	pg, ok := store.(pinger)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeProbeTimeout)
	defer cancel()
	return pg.Ping(ctx)
}

// probeStores pings both stores and records the outcomes.
func (c *Controller) probeStores(ctx context.Context) StorageStatus {
	st := StorageStatus{
		ActivityPool: c.probe.record(storeActivityPool, ping(ctx, c.o.Pool), c.o.Now()),
		Management:   c.probe.record(storeManagement, ping(ctx, c.o.Management), c.o.Now()),
	}
	if g, ok := c.o.Pool.(generations); ok {
		st.GenerationChanges = g.GenerationChanges()
	}
	return st
}

// watchStores probes the stores every storeProbeEvery, so the metrics
// and the log follow an outage without anyone asking.
func (c *Controller) watchStores(ctx context.Context) error {
	loop.Run(ctx, storeProbeEvery, nil, c.log, "probing the stores", func(ctx context.Context) error {
		c.probeStores(ctx)
		return nil
	})
	return nil
}
