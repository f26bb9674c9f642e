package dispatch_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

// TestConcurrentAcquireCommitRelease hammers a small pool from 64
// goroutines so that reservations constantly race for the last slot. Every
// observation of every counter must stay within its limit, and everything
// must be back to zero at the end.
func TestConcurrentAcquireCommitRelease(t *testing.T) {
	const (
		workers  = 64
		perW     = 400
		limit    = 3
		nProxies = 4
	)
	var ps []proxy.Proxy
	for i := range nProxies {
		ps = append(ps, px("a", i+1, func(p *proxy.Proxy) { p.MaxConcurrency = limit }))
	}
	ws := gwtest.Snapshot(1, t0, ps...)
	e := newEnv(t, ws, 0)
	// A second snapshot swapped in mid-run: counters must carry over.
	ws2 := gwtest.Snapshot(2, t0, ps...)

	var counters []*snapshot.Counter
	for _, p := range ps {
		counters = append(counters, e.reg.Counter(p.ID))
	}
	var violations, ok, refused atomic.Int64
	observe := func() {
		for _, c := range counters {
			if c.InUse() > limit {
				violations.Add(1)
			}
		}
	}
	stop := make(chan struct{})
	var observer sync.WaitGroup
	observer.Add(1)
	go func() {
		defer observer.Done()
		for {
			select {
			case <-stop:
				return
			default:
				observe()
			}
		}
	}()

	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx := context.Background()
			// Each worker holds up to two allocations at a time, so 64
			// workers want far more slots than the 12 that exist and
			// reservations keep racing for the last one.
			var held []dispatch.Allocation
			for i := range perW {
				req := dispatch.Request{Host: "h" + strconv.Itoa(w%3)}
				a, err := e.d.Acquire(ctx, &req)
				observe()
				if err != nil {
					refused.Add(1)
				} else {
					ok.Add(1)
					if i%2 == 0 {
						if err := e.d.Commit(a); err != nil {
							t.Error(err)
						}
						observe()
					}
					held = append(held, a)
				}
				if len(held) == 2 || (err != nil && len(held) > 0) {
					a := held[0]
					held = held[1:]
					e.d.Release(a, worker.Outcome{Success: rand.IntN(2) == 0})
				}
				runtime.Gosched()
			}
			for _, a := range held {
				e.d.Release(a, worker.Outcome{Success: true})
			}
		}()
	}
	close(start)
	s2, err := snapshot.Build(ws2, e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.snaps.Store(s2)
	wg.Wait()
	close(stop)
	observer.Wait()

	if v := violations.Load(); v != 0 {
		t.Fatalf("%d observations above the limit", v)
	}
	for i, c := range counters {
		if a, r := c.Counts(); a != 0 || r != 0 {
			t.Fatalf("proxy %d left with active %d reserved %d", i, a, r)
		}
	}
	if rt := e.reg.Runtime(); len(rt) != 0 {
		t.Fatalf("runtime not empty: %+v", rt)
	}
	if ok.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("no contention: ok=%d refused=%d", ok.Load(), refused.Load())
	}
}

func TestAcquireCommitReleaseAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	e := newEnv(t, bigSnapshot(1000), 0)
	ctx := context.Background()
	req := dispatch.Request{Host: "example.com", Port: 443}
	req.AddExclude(proxy.ID("not-a-proxy"))
	allocs := testing.AllocsPerRun(1000, func() {
		a, err := e.d.Acquire(ctx, &req)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.d.Commit(a); err != nil {
			t.Fatal(err)
		}
		e.d.Release(a, worker.Outcome{Success: true})
	})
	if allocs != 0 {
		t.Fatalf("Acquire+Commit+Release allocates %.1f times", allocs)
	}
	// Refusing allocates nothing either.
	one := newEnv(t, bigSnapshot(1), 0)
	only := one.snaps.Load().Rules()[0].Candidates()[0].Target().ID
	refuse := dispatch.Request{Exclude: [dispatch.MaxExclude]proxy.ID{only}}
	allocs = testing.AllocsPerRun(1000, func() {
		if _, err := one.d.Acquire(ctx, &refuse); err == nil {
			t.Fatal("acquired an excluded proxy")
		}
	})
	if allocs != 0 {
		t.Fatalf("a refused Acquire allocates %.1f times", allocs)
	}
}

// bigSnapshot has n proxies in one upstream, usable for a day, with a
// concurrency limit no benchmark reaches.
func bigSnapshot(n int) *worker.Snapshot { return bigSnapshotAt(n, 1<<20, t0) }

func bigSnapshotAt(n int, limit int64, base time.Time) *worker.Snapshot {
	ps := make([]proxy.Proxy, n)
	for i := range ps {
		ps[i] = gwtest.MakeProxy("a", "198.51."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250+1), 3128, "u", "p", base)
		ps[i].UsableUntil = base.Add(24 * time.Hour)
		ps[i].MaxConcurrency = limit
	}
	ws := gwtest.Snapshot(1, base, ps...)
	ws.ValidUntil = base.Add(24 * time.Hour)
	return ws
}

// newBenchEnv runs on the real clock: time.Now's cost belongs in the
// measurement.
func newBenchEnv(b *testing.B, n int, limit int64) *env {
	b.Helper()
	ws := bigSnapshotAt(n, limit, time.Now())
	e := &env{snaps: &snapshot.Holder{}, prom: prometheus.NewRegistry()}
	e.reg = snapshot.NewRegistry(2*n, time.Now)
	s, err := snapshot.Build(ws, e.reg)
	if err != nil {
		b.Fatal(err)
	}
	e.snaps.Store(s)
	e.d = dispatch.New(e.snaps, dispatch.Options{Registerer: e.prom})
	return e
}

// BenchmarkAcquireCommitRelease measures one allocation round trip on a
// 100,000-proxy snapshot, serially and from every P in parallel.
func BenchmarkAcquireCommitRelease(b *testing.B) {
	const n = 100_000
	e := newBenchEnv(b, n, 1<<20)
	one := func(ctx context.Context, req *dispatch.Request) {
		a, err := e.d.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.d.Commit(a); err != nil {
			b.Fatal(err)
		}
		e.d.Release(a, worker.Outcome{Success: true})
	}
	b.Run("serial", func(b *testing.B) {
		ctx := context.Background()
		req := dispatch.Request{Host: "example.com", Port: 443}
		b.ReportAllocs()
		for b.Loop() {
			one(ctx, &req)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			req := dispatch.Request{Host: "example.com", Port: 443}
			for pb.Next() {
				one(ctx, &req)
			}
		})
	})
	// Saturated: every proxy holds one reservation with limit 1, so
	// each Acquire probes up to MaxProbes entries before refusing — the
	// worst case the probe bound exists for.
	b.Run("saturated", func(b *testing.B) {
		es := newBenchEnv(b, n, 1)
		for _, r := range es.snaps.Load().Rules() {
			for _, en := range r.Candidates() {
				for en.Counter().TryReserve(en.Limit()) {
				}
			}
		}
		ctx := context.Background()
		req := dispatch.Request{Host: "example.com", Port: 443}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := es.d.Acquire(ctx, &req); err == nil {
				b.Fatal("acquired on a saturated pool")
			}
		}
	})
}
