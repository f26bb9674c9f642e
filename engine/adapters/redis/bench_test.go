package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// benchUpstreams share the benchmark pool evenly; BulkLoadAvailable deals
// each upstream's entries over redisstore.BenchRegions.
var benchUpstreams = []string{"a", "b", "c", "d"}

// BenchmarkRedisPool measures the storage targets of docs/benchmarks.md on
// a real redis-server: inventory reads and batch-of-10 extractions at 1 and
// 32 concurrent clients, with 10,000 and then 1,000,000 AVAILABLE entries
// spread over four upstreams and four regions. Extractions run unfiltered
// (the global free index), with a region filter that one entry in four
// passes (the requests rotate over the regions, as a mixed clientele
// would, so the walk stays representative), with every call asking for
// region eu (the skew that made a walk of a shared index re-read what
// earlier calls rejected), and limited to two of the four upstreams. The pool is topped up before each run so that it holds
// the stated size until the run's last batch (pool-entries reports what
// Redis counted at the start).
//
// Per batch: p50/p99 from an HDR histogram of every call (1 µs to 10 s, 3
// significant digits), as the client saw it; server-µs is the script's
// wall time inside Redis (INFO commandstats), server-cpu-µs the Redis
// process's CPU time per call (INFO cpu) — the figure a loaded machine
// inflates least, and the one that bounds throughput; max-inflight is the
// most calls the benchmark had outstanding at once (32 proves the 32-client
// runs queue 32 calls at Redis).
//
// The 1,000,000 size (about 1 GB in Redis, a minute to load) runs only
// when -bench names this benchmark rather than ".":
//
//	go test -run '^$' -bench BenchmarkRedisPool -benchtime 3000x ./engine/adapters/redis/
func BenchmarkRedisPool(b *testing.B) {
	sizes := []int{10_000}
	if pat := flag.Lookup("test.bench").Value.String(); pat != "." && pat != ".*" {
		sizes = append(sizes, 1_000_000)
	}
	srv := testenv.StartRedis(b)
	ctx := context.Background()
	p, err := redisstore.OpenWith(ctx, config.Redis{URL: srv.URL()}, redisstore.Options{Namespace: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	loads := 0
	// topUp loads what each upstream lacks of its share of size plus what
	// the run may draw from it, and returns the pool's count as Redis
	// reports it: the pool holds at least size until the run's last batch.
	topUp := func(b *testing.B, size int, draw func(up string) int) int {
		b.Helper()
		loads++
		for _, up := range benchUpstreams {
			inv, err := p.Inventory(ctx, up, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			if missing := size/len(benchUpstreams) + draw(up) - inv.Available; missing > 0 {
				if err := redisstore.BulkLoadAvailable(ctx, p, up, fmt.Sprintf("l%d%s", loads, up), missing); err != nil {
					b.Fatal(err)
				}
			}
		}
		c, err := p.Counts(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return c[proxy.StateAvailable]
	}
	// Each case draws its batches from the upstreams it names, or from
	// all of them evenly; a case that draws from one region only gets
	// share times its draw loaded before each run, as loads deal regions
	// out in turn.
	cases := []struct {
		name    string
		ups     []string
		filters func(i int) extraction.Filters
		share   int
	}{
		{"unfiltered", benchUpstreams, func(int) extraction.Filters { return extraction.Filters{} }, 1},
		{"region", benchUpstreams, func(i int) extraction.Filters {
			return extraction.Filters{
				Region: redisstore.BenchRegions[i%len(redisstore.BenchRegions)], Protocol: proxy.SchemeHTTP,
				MinRemainingTTL: 5 * time.Minute, MaxHealthCheckAge: time.Hour,
			}
		}, 1},
		{"region=eu", benchUpstreams, func(int) extraction.Filters { return extraction.Filters{Region: "eu"} }, len(redisstore.BenchRegions)},
		{"upstreams=2", benchUpstreams[1:3], func(int) extraction.Filters { return extraction.Filters{Upstreams: benchUpstreams[1:3]} }, 1},
	}
	for _, size := range sizes {
		b.Run(fmt.Sprintf("entries=%d/Inventory", size), func(b *testing.B) {
			entries := topUp(b, size, func(string) int { return 0 })
			h := newHist()
			s0 := serverStats(b, p)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				inv, err := p.Inventory(ctx, "a", time.Now())
				_ = h.RecordValue(time.Since(t0).Microseconds())
				if err != nil || inv.Available < size/len(benchUpstreams) {
					b.Fatalf("inventory %+v, %v", inv, err)
				}
			}
			b.StopTimer()
			report(b, h, serverStats(b, p).since(s0), b.N)
			b.ReportMetric(float64(entries), "pool-entries")
		})
		for _, c := range cases {
			for _, clients := range []int{1, 32} {
				b.Run(fmt.Sprintf("entries=%d/Extract10/%s/clients=%d", size, c.name, clients), func(b *testing.B) {
					draw := func(up string) int {
						if slices.Contains(c.ups, up) {
							return (10*b.N*c.share + len(c.ups) - 1) / len(c.ups)
						}
						return 0
					}
					if c.share > 1 {
						// The upstream's total hides how few of the one
						// region are left: load the run's share on top.
						for _, up := range c.ups {
							loads++
							if err := redisstore.BulkLoadAvailable(ctx, p, up, fmt.Sprintf("l%d%s", loads, up), draw(up)); err != nil {
								b.Fatal(err)
							}
						}
						draw = func(string) int { return 0 }
					}
					entries := topUp(b, size, draw)
					hists := make([]*hdrhistogram.Histogram, clients)
					var inflight, maxInflight atomic.Int64
					var wg sync.WaitGroup
					s0 := serverStats(b, p)
					b.ResetTimer()
					start := time.Now()
					for cl := range clients {
						n := b.N / clients
						if cl < b.N%clients {
							n++
						}
						hists[cl] = newHist()
						wg.Add(1)
						go func(h *hdrhistogram.Histogram) {
							defer wg.Done()
							for i := range n {
								req := extraction.Request{Client: "bench", Count: 10, Fulfillment: extraction.Partial, Filters: c.filters(cl + i)}
								t0 := time.Now()
								in := inflight.Add(1)
								for m := maxInflight.Load(); in > m && !maxInflight.CompareAndSwap(m, in); m = maxInflight.Load() {
								}
								res, err := p.Extract(ctx, req)
								inflight.Add(-1)
								_ = h.RecordValue(time.Since(t0).Microseconds())
								if err != nil || res.Returned != 10 {
									b.Errorf("extract %d, %v", res.Returned, err)
									return
								}
							}
						}(hists[cl])
					}
					wg.Wait()
					elapsed := time.Since(start)
					b.StopTimer()
					all := newHist()
					for _, h := range hists {
						all.Merge(h)
					}
					report(b, all, serverStats(b, p).since(s0), b.N)
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
					b.ReportMetric(float64(entries), "pool-entries")
					b.ReportMetric(float64(maxInflight.Load()), "max-inflight")
				})
			}
		}
	}
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 10_000_000, 3) }

// stats is what Redis itself reports: the wall time inside EVALSHA
// (commandstats) and the server's CPU time.
type stats struct {
	evalUsec, evalCalls, cpuSec float64
}

func (s stats) since(s0 stats) stats {
	return stats{s.evalUsec - s0.evalUsec, s.evalCalls - s0.evalCalls, s.cpuSec - s0.cpuSec}
}

func serverStats(b *testing.B, p *redisstore.Pool) stats {
	info, err := p.Client().Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var s stats
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					s.evalCalls = f
				case "usec":
					s.evalUsec = f
				}
			}
		}
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				s.cpuSec += f
			}
		}
	}
	return s
}

func report(b *testing.B, h *hdrhistogram.Histogram, s stats, calls int) {
	b.ReportMetric(float64(h.ValueAtQuantile(50)), "p50-µs")
	b.ReportMetric(float64(h.ValueAtQuantile(99)), "p99-µs")
	if s.evalCalls > 0 {
		b.ReportMetric(s.evalUsec/s.evalCalls, "server-µs/op")
	}
	b.ReportMetric(s.cpuSec*1e6/float64(calls), "server-cpu-µs/op")
}
