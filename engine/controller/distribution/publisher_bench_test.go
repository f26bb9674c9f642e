package distribution

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
)

// BenchmarkPublish is one publish round at 100,000 AVAILABLE proxies with
// the standalone worker registered (its Apply only records the snapshot:
// the gateway's build is measured in engine/gateway/snapshot). Between
// rounds (not timed) churn proxies are replaced: the new ones arrive
// unowned, so a round assigns them. retained-MiB is the heap the
// publisher and its last snapshot hold after the last round; peak-RSS-MiB
// the process's high-water mark (VmHWM), pool included: run one case per
// process to read it.
func BenchmarkPublish(b *testing.B) {
	for _, churn := range []int{0, 1000} {
		b.Run(map[int]string{0: "churn=0", 1000: "churn=1%"}[churn], func(b *testing.B) {
			ctx := context.Background()
			pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
			c := &ctltest.Churn{Pool: pool, Upstream: "a", Now: t0}
			if err := c.Fill(ctx, 100_000); err != nil {
				b.Fatal(err)
			}
			before := liveHeap()
			p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0.Add(time.Second) }})
			p.SetView(View{Rules: ctlrouting.Compile([]config.Routing{{Name: "all", Strategy: "leastConnections", Upstreams: []string{"a"}}})})
			w := ctltest.NewWorker()
			p.Register("local", w)
			if err := p.Publish(ctx); err != nil { // first round: assigns everything
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if err := c.Step(ctx, churn); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := p.Publish(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if n := len(w.Last().Proxies); n != 100_000 {
				b.Fatalf("published %d proxies", n)
			}
			b.ReportMetric(float64(liveHeap()-before)/(1<<20), "retained-MiB")
			if kib, ok := peakRSS(); ok {
				b.ReportMetric(float64(kib)/1024, "peak-RSS-MiB")
			}
			runtime.KeepAlive(p)
			runtime.KeepAlive(c)
		})
	}
}

// peakRSS reads VmHWM in KiB from /proc (Linux only).
func peakRSS() (int64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kib, err == nil
		}
	}
	return 0, false
}

func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
