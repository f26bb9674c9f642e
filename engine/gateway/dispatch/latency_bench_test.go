package dispatch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
)

// latencySample times one operation in this many: reading the clock twice
// per operation would cost more than the operation itself.
const latencySample = 32

// BenchmarkAcquireCommitReleaseLatency runs Acquire+Commit+Release on a
// 100,000-proxy snapshot from 1 and from 64 goroutines and reports, besides
// ns/op and allocs/op, the p50/p99/p999 of the per-operation latency of a
// 1-in-32 sample, recorded in an HDR histogram (1 ns to 1 s, 3 significant
// digits). With 64 goroutines on fewer cores the tail includes time spent
// descheduled mid-operation, as a loaded worker would see it.
func BenchmarkAcquireCommitReleaseLatency(b *testing.B) {
	const n = 100_000
	e := newBenchEnv(b, n, 1<<20)
	for _, workers := range []int{1, 64} {
		b.Run(map[int]string{1: "goroutines=1", 64: "goroutines=64"}[workers], func(b *testing.B) {
			hists := make([]*hdrhistogram.Histogram, workers)
			for i := range hists {
				hists[i] = hdrhistogram.New(1, int64(time.Second), 3)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := range workers {
				ops := b.N / workers
				if w < b.N%workers {
					ops++
				}
				wg.Add(1)
				go func(h *hdrhistogram.Histogram, ops int) {
					defer wg.Done()
					ctx := context.Background()
					req := dispatch.Request{Host: "example.com", Port: 443}
					for i := range ops {
						var t0 time.Time
						sampled := i%latencySample == 0
						if sampled {
							t0 = time.Now()
						}
						a, err := e.d.Acquire(ctx, &req)
						if err != nil {
							b.Error(err)
							return
						}
						if err := e.d.Commit(a); err != nil {
							b.Error(err)
							return
						}
						e.d.Release(a, worker.Outcome{Success: true})
						if sampled {
							_ = h.RecordValue(int64(time.Since(t0)))
						}
					}
				}(hists[w], ops)
			}
			wg.Wait()
			b.StopTimer()
			all := hdrhistogram.New(1, int64(time.Second), 3)
			for _, h := range hists {
				all.Merge(h)
			}
			if all.TotalCount() > 0 {
				b.ReportMetric(float64(all.ValueAtQuantile(50)), "p50-ns")
				b.ReportMetric(float64(all.ValueAtQuantile(99)), "p99-ns")
				b.ReportMetric(float64(all.ValueAtQuantile(99.9)), "p999-ns")
			}
		})
	}
}
