package snapshot_test

import (
	"runtime"
	"testing"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

func bigWorkerSnapshot(n int) *worker.Snapshot {
	ps := make([]proxy.Proxy, n)
	ups := []string{"u0", "u1", "u2", "u3"}
	for i := range ps {
		ps[i] = mk(ups[i%len(ups)], i)
		ps[i].Key.Port = uint16(1024 + i%50000)
		ps[i].ID = proxy.MakeID(ps[i].Key)
	}
	return gwtest.Snapshot(1, t0, ps...)
}

// BenchmarkSnapshotBuild builds a 100,000-proxy snapshot over four
// upstreams and swaps it in. "warm" is the steady state of a worker
// receiving a full snapshot (the counters exist); "cold" is the first
// snapshot of a fresh worker (every counter and target is created). Each
// reports B/op (allocated per build) and retained-MiB (live heap the
// published snapshot and registry hold, measured after a GC).
func BenchmarkSnapshotBuild(b *testing.B) {
	const n = 100_000
	ws := bigWorkerSnapshot(n)
	b.Run("warm", func(b *testing.B) {
		reg := snapshot.NewRegistry(2*n, clock())
		var h snapshot.Holder
		s, err := snapshot.Build(ws, reg)
		if err != nil {
			b.Fatal(err)
		}
		h.Store(s)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			ws.Version = uint64(i + 2)
			s, err := snapshot.Build(ws, reg)
			if err != nil {
				b.Fatal(err)
			}
			h.Store(s)
		}
		b.StopTimer()
		reportRetained(b, ws, 2)
	})
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		var h snapshot.Holder
		var reg *snapshot.Registry
		for b.Loop() {
			reg = snapshot.NewRegistry(2*n, clock())
			s, err := snapshot.Build(ws, reg)
			if err != nil {
				b.Fatal(err)
			}
			h.Store(s)
		}
		b.StopTimer()
		reportRetained(b, ws, 1)
	})
}

// reportRetained measures the live heap a fresh registry and its built,
// published snapshot keep (after a GC), and reports it.
func reportRetained(b *testing.B, ws *worker.Snapshot, builds int) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	reg := snapshot.NewRegistry(2*len(ws.Proxies), clock())
	var h snapshot.Holder
	for i := range builds {
		ws.Version = uint64(1000 + i)
		s, err := snapshot.Build(ws, reg)
		if err != nil {
			b.Fatal(err)
		}
		h.Store(s)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(reg)
	runtime.KeepAlive(h.Load())
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "retained-MiB")
}
