package snapshot_test

import (
	"testing"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

// BenchmarkSnapshotBuild builds a 100,000-proxy snapshot over four
// upstreams into a warm registry: the steady state of a worker receiving
// a full snapshot.
func BenchmarkSnapshotBuild(b *testing.B) {
	const n = 100_000
	ps := make([]proxy.Proxy, n)
	ups := []string{"u0", "u1", "u2", "u3"}
	for i := range ps {
		ps[i] = mk(ups[i%len(ups)], i)
		ps[i].Key.Port = uint16(1024 + i%50000)
		ps[i].ID = proxy.MakeID(ps[i].Key)
	}
	ws := gwtest.Snapshot(1, t0, ps...)
	reg := snapshot.NewRegistry(2*n, clock())
	if _, err := snapshot.Build(ws, reg); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		ws.Version = uint64(i + 2)
		if _, err := snapshot.Build(ws, reg); err != nil {
			b.Fatal(err)
		}
	}
}
