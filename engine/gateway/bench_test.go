package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/gateway"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// benchBody is the response size of issue 8's figure (GET /bytes/1024).
const benchBody = 1024

// fastUpstream is a minimal HTTP/1.1 upstream proxy for benchmarks: it
// reads request heads and answers each with a fixed 1 KiB response, or
// answers a CONNECT with 200 and then closes once the client closes. It
// costs next to nothing, so what a benchmark measures is the gateway.
func fastUpstream(tb testing.TB) (string, uint16) {
	tb.Helper()
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " +
		strconv.Itoa(benchBody) + "\r\n\r\n" + string(bytes.Repeat([]byte{'x'}, benchBody)))
	return gwtest.SplitAddr(tb, gwtest.Serve(tb, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReaderSize(c, 4096)
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			connect := bytes.HasPrefix(line, []byte("CONNECT "))
			for len(line) > 2 {
				if line, err = br.ReadSlice('\n'); err != nil {
					return
				}
			}
			if connect {
				_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				_, _ = io.Copy(io.Discard, br)
				return
			}
			if _, err := c.Write(resp); err != nil {
				return
			}
		}
	}))
}

// benchGateway serves a gateway routing over n fast upstreams.
func benchGateway(b testing.TB, n int) *harness {
	b.Helper()
	cfg, err := config.Parse([]byte(baseConfig))
	if err != nil {
		b.Fatal(err)
	}
	h := &harness{sink: &sink{}, served: make(chan error, 1)}
	h.g, err = gateway.New(gateway.Options{Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	h.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { h.served <- h.g.Serve(ctx, ln) }()
	b.Cleanup(func() {
		cancel()
		<-h.served
		h.g.Close()
	})
	now := time.Now()
	var ws = gwtest.Snapshot(1, now)
	for i := range n {
		host, port := fastUpstream(b)
		p := gwtest.MakeProxy("vendor", host, port, fmt.Sprintf("u%d", i), "p", now)
		p.MaxConcurrency = 1024
		ws.Proxies = append(ws.Proxies, p)
	}
	ws.Routings[0].Upstreams = []string{"vendor"}
	if err := h.g.Apply(context.Background(), ws); err != nil {
		b.Fatal(err)
	}
	return h
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds the process CPU per operation (gateway, fake upstream and
// client together; the fakes are constant between versions).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// readResponse reads one response with a Content-Length body from br.
func readResponse(br *bufio.Reader) error {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
		return fmt.Errorf("status line %q", line)
	}
	n := -1
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if len(line) > 15 && bytes.EqualFold(line[:15], []byte("content-length:")) {
			n = 0
			for _, c := range bytes.TrimSpace(line[15:]) {
				n = n*10 + int(c-'0')
			}
		}
	}
	if n != benchBody {
		return fmt.Errorf("content length %d", n)
	}
	_, err = br.Discard(n)
	return err
}

// BenchmarkForward is one GET through the assembled gateway and a fast
// upstream over loopback, keep-alive on both sides: allocs/op and
// cpu-µs/op are the figures of issue 8 (compare before/after a change).
func BenchmarkForward(b *testing.B) {
	h := benchGateway(b, 4)
	req := []byte("GET http://127.0.0.1:9/bytes/1024 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")
	b.ReportAllocs()
	b.SetParallelism(4)
	start := cpuTime(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for pb.Next() {
			if _, err := c.Write(req); err != nil {
				b.Error(err)
				return
			}
			if err := readResponse(br); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportCPU(b, start)
}

// BenchmarkConnectSetup opens a new CONNECT tunnel per operation (new
// client connection, 200, close), the setup-rate figure of issue 8.
func BenchmarkConnectSetup(b *testing.B) {
	h := benchGateway(b, 4)
	req := []byte("CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
	const established = "HTTP/1.1 200 Connection established\r\n\r\n"
	b.ReportAllocs()
	b.SetParallelism(4)
	start := cpuTime(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, len(established))
		for pb.Next() {
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := c.Write(req); err != nil {
				b.Error(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != established {
				rest, _ := io.ReadAll(io.LimitReader(c, 512))
				b.Errorf("reply %q %v", append(buf, rest...), err)
			}
			c.Close()
		}
	})
	b.StopTimer()
	reportCPU(b, start)
}
