package relay

import (
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ioCopyPipe is the gateway's copy before this package: an io.Copy per
// direction (which splices between TCP connections, holding a pipe pair
// per direction for its whole life).
func ioCopyPipe(client, upstream io.ReadWriteCloser) (up, down int64, err error) {
	upDone := make(chan int64, 1)
	go func() {
		n, err := io.Copy(upstream, client)
		finish(err, upstream, client)
		upDone <- n
	}()
	down, err = io.Copy(client, upstream)
	finish(err, client, upstream)
	return <-upDone, down, err
}

type copier func(client, upstream io.ReadWriteCloser) (int64, int64, error)

var bufferPool, splicePool = NewPool(Options{}), NewPool(Options{Splice: true})

var copiers = []struct {
	name string
	copy copier
}{
	{"relay", bufferPool.Copy},
	{"relay-splice", splicePool.Copy},
	{"io.Copy", ioCopyPipe},
}

// openWith is lnPair.open with any copier.
func (l *lnPair) openWith(t testing.TB, cp copier) *tunnel {
	tn := &tunnel{done: make(chan result, 1)}
	tn.client, tn.gwClient = l.pair(t)
	tn.gwUp, tn.server = l.pair(t)
	go func() {
		up, down, err := cp(tn.gwClient, tn.gwUp)
		tn.done <- result{up, down, err}
	}()
	t.Cleanup(tn.closeAll)
	return tn
}

// BenchmarkBulk is the throughput of one tunnel carrying a bulk download
// (MB/s) and the process's CPU per MiB, relayed or through the old
// io.Copy pair.
func BenchmarkBulk(b *testing.B) {
	const chunk = 1 << 20
	for _, c := range copiers {
		b.Run(c.name, func(b *testing.B) {
			l := newLn(b)
			tn := l.openWith(b, c.copy)
			read := make(chan error, 1)
			go func() {
				_, err := io.CopyN(io.Discard, tn.client, int64(b.N)*chunk)
				read <- err
			}()
			buf := make([]byte, chunk)
			b.SetBytes(chunk)
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for range b.N {
				if _, err := tn.server.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-read; err != nil {
				b.Fatal(err)
			}
			// CPU is steadier than MB/s on a shared machine; the writer
			// and reader cost the same in every variant.
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N)/1e3, "cpu-µs/MiB")
		})
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// idleTunnels is how many tunnels BenchmarkIdle holds; with the io.Copy
// copier they need 8 descriptors each in this process (its 20,000 cap).
const idleTunnels = 2000

// BenchmarkIdle holds idleTunnels idle tunnels (after one byte each way)
// and reports what each costs the process: descriptors (besides the
// test's own two ends), RSS, and heap plus goroutine stacks. "sockets
// only" opens the same connections with no copy: the floor. Run it with
// -benchtime=1x; it measures once whatever b.N is.
func BenchmarkIdle(b *testing.B) {
	variants := append([]struct {
		name string
		copy copier
	}{{"sockets-only", nil}}, copiers...)
	for _, c := range variants {
		b.Run(c.name, func(b *testing.B) {
			l := newLn(b)
			fds0, rss0, mem0 := usage(b)
			tns := make([]*tunnel, idleTunnels)
			for i := range tns {
				if c.copy == nil {
					tn := &tunnel{}
					tn.client, tn.gwClient = l.pair(b)
					tn.gwUp, tn.server = l.pair(b)
					b.Cleanup(tn.closeAll)
					tns[i] = tn
					continue
				}
				tns[i] = l.openWith(b, c.copy)
				roundTrip(b, tns[i])
			}
			// Let every copy return its pipe and park.
			deadline := time.Now().Add(waitBound)
			for st := splicePool.Stats(); st.Idle != st.Live && time.Now().Before(deadline); st = splicePool.Stats() {
				time.Sleep(time.Millisecond)
			}
			fds, rss, mem := usage(b)
			n := float64(idleTunnels)
			b.ReportMetric(float64(fds-fds0)/n-2, "fds/tunnel")
			b.ReportMetric(float64(rss-rss0)/n/1024, "rss-KiB/tunnel")
			b.ReportMetric(float64(mem-mem0)/n/1024, "heap+stack-KiB/tunnel")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// usage is this process's descriptors, RSS and Go heap plus stacks in
// use, after a collection.
func usage(b *testing.B) (fds int, rss, mem uint64) {
	runtime.GC()
	fds, _ = fdCount(b)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(statm))
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return fds, pages * uint64(os.Getpagesize()), ms.HeapInuse + ms.StackInuse
}
