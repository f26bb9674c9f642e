package loadgen

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procStat
		wantErr bool
	}{
		{
			name: "plain",
			in:   "4242 (proxypool) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 50 0 0 20 0 12 0 100 1000000 2000 18446744073709551615",
			want: procStat{PPID: 1, Ticks: 200, Threads: 12},
		},
		{
			name: "command with spaces and parentheses",
			in:   "77 (squid (kid-1) x) R 76 77 77 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 100 10",
			want: procStat{PPID: 76, Ticks: 10, Threads: 1},
		},
		{name: "no command", in: "77 squid R 76", wantErr: true},
		{name: "truncated", in: "77 (squid) R 76 77", wantErr: true},
		{name: "garbage number", in: "77 (squid) R x 77 77 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 100 10", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"present", "Name:\tproxypool\nVmPeak:\t  9000 kB\nVmRSS:\t   2048 kB\nThreads:\t9\n", 2048 << 10, false},
		{"kernel thread has none", "Name:\tkthreadd\nThreads:\t1\n", 0, false},
		{"bad unit", "VmRSS:\t 12 MB\n", 0, true},
		{"bad number", "VmRSS:\t x kB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVmRSS([]byte(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("got %d, %v; want %d, err %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseHostFiles(t *testing.T) {
	dev := "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n" +
		"  eth0: 999 9 0 0 0 0 0 0 999 9 0 0 0 0 0 0\n" +
		"    lo: 123456 100 0 0 0 0 0 0 123456 100 0 0 0 0 0 0\n"
	if got, err := parseLoopback([]byte(dev)); err != nil || got != 123456 {
		t.Errorf("parseLoopback = %d, %v; want 123456", got, err)
	}
	if _, err := parseLoopback([]byte("  eth0: 1 2 3\n")); err == nil {
		t.Error("parseLoopback without lo: want an error")
	}
	ss := "sockets: used 300\nTCP: inuse 42 orphan 0 tw 17 alloc 50 mem 3\nUDP: inuse 1 mem 0\n"
	if got, err := parseSockstat([]byte(ss)); err != nil || got != (sockstat{InUse: 42, TimeWait: 17}) {
		t.Errorf("parseSockstat = %+v, %v", got, err)
	}
	if _, err := parseSockstat([]byte("UDP: inuse 1\n")); err == nil {
		t.Error("parseSockstat without TCP: want an error")
	}
	ns := "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPSynRetrans TCPTimeWaitOverflow\n" +
		"TcpExt: 1 2 3 4 5\nIpExt: InNoRoutes\nIpExt: 0\n"
	if got, err := parseNetstat([]byte(ns)); err != nil || got != (tcpExt{ListenOverflows: 2, ListenDrops: 3, SynRetrans: 4, TimeWaitOverflow: 5}) {
		t.Errorf("parseNetstat = %+v, %v", got, err)
	}
	for _, bad := range []string{"IpExt: a\nIpExt: 1\n", "TcpExt: ListenDrops\nTcpExt: 1 2\n", "TcpExt: ListenDrops\nTcpExt: x\n", "TcpExt: ListenDrops\n"} {
		if _, err := parseNetstat([]byte(bad)); err == nil {
			t.Errorf("parseNetstat(%q): want an error", bad)
		}
	}
	if got, err := parseLoadavg([]byte("5.84 6.61 7.03 3/900 12345\n")); err != nil || got != 5.84 {
		t.Errorf("parseLoadavg = %v, %v", got, err)
	}
}

func TestParseClkTck(t *testing.T) {
	pair := func(k, v uint64) []byte {
		b := make([]byte, 16)
		binary.LittleEndian.PutUint64(b, k)
		binary.LittleEndian.PutUint64(b[8:], v)
		return b
	}
	auxv := slices.Concat(pair(6, 4096), pair(atClkTck, 100), pair(0, 0))
	if got := parseClkTck(auxv); got != 100 {
		t.Errorf("parseClkTck = %d, want 100", got)
	}
	if got := parseClkTck(slices.Concat(pair(6, 4096), pair(0, 0), pair(atClkTck, 250))); got != 0 {
		t.Errorf("entries after AT_NULL must be ignored, got %d", got)
	}
	if got := parseClkTck([]byte{1, 2, 3}); got != 0 {
		t.Errorf("short vector: got %d", got)
	}
}

// TestSamplerOwnProcess samples this test process and a child it started,
// through the real /proc.
func TestSamplerOwnProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Skipf("cannot start a child: %v", err)
	}
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	})
	if got := descendants([]int{os.Getpid()}); !slices.Contains(got, child.Process.Pid) {
		t.Fatalf("descendants(self) = %v, missing child %d", got, child.Process.Pid)
	}

	s := NewSampler([]int{os.Getpid()}, true, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	// Burn a little CPU so the second sample has something to count.
	x := 0
	for i := range 20_000_000 {
		x += i
	}
	_ = x
	cancel()
	<-done
	p, h := s.Stats()
	if p == nil {
		t.Fatal("no process stats")
	}
	if p.Samples != 2 || p.Processes < 2 {
		t.Errorf("samples %d, processes %d; want 2 samples of at least 2 processes", p.Samples, p.Processes)
	}
	if p.RSSMaxBytes <= 0 || p.FDsMax <= 0 || p.ThreadsMax <= 0 {
		t.Errorf("rss %d, fds %d, threads %d: want all positive", p.RSSMaxBytes, p.FDsMax, p.ThreadsMax)
	}
	if p.CPUSeconds < 0 || p.CPUPercent < 0 {
		t.Errorf("cpu %v s, %v%%: negative", p.CPUSeconds, p.CPUPercent)
	}
	if h.TCPInUseMax < 0 || h.Load1End < 0 {
		t.Errorf("host stats: %+v", h)
	}
	if rss, err := RSS(os.Getpid()); err != nil || rss <= 0 {
		t.Errorf("RSS(self) = %d, %v", rss, err)
	}
	if _, err := readProcGone(); err == nil {
		t.Error("reading a process that does not exist: want an error")
	}
}

// readProcGone reads a PID above the kernel's maximum.
func readProcGone() (procStat, error) {
	st, _, _, err := readProc(1 << 30)
	return st, err
}

// FuzzParseProcFiles: no /proc content makes a parser panic.
func FuzzParseProcFiles(f *testing.F) {
	f.Add([]byte("TcpExt: ListenOverflows TCPSynRetrans\nTcpExt: 1 2\n"))
	f.Add([]byte("TCP: inuse 42 orphan 0 tw 17 alloc 50 mem 3\n"))
	f.Add([]byte("    lo: 123456 100 0 0 0 0 0 0 123456 100 0 0 0 0 0 0\n"))
	f.Add([]byte("1234 (proxy pool) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20\n"))
	f.Add([]byte("VmRSS:\t  1024 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseNetstat(b)
		_, _ = parseSockstat(b)
		_, _ = parseLoopback(b)
		_, _ = parseLoadavg(b)
		_, _ = parseVmRSS(b)
		_, _ = parseStat(b)
	})
}
