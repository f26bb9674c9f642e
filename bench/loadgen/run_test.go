package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/testenv"
)

// loopbackEnv is a target and an upstream proxy requiring credentials,
// from testenv, on loopback.
type loopbackEnv struct {
	target, tlsTarget *testenv.Target
	proxy             *testenv.UpstreamProxy
}

func newLoopbackEnv(t *testing.T) *loopbackEnv {
	t.Helper()
	target, err := testenv.NewTarget("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	tlsTarget, err := testenv.NewTLSTarget("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tlsTarget.Close() })
	proxy, err := testenv.NewUpstreamProxy(testenv.UpstreamConfig{Username: "bench", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return &loopbackEnv{target: target, tlsTarget: tlsTarget, proxy: proxy}
}

func (e *loopbackEnv) proxyURL(user string) string {
	return "http://" + user + "@" + e.proxy.Addr()
}

// serve runs h on a loopback listener until the test ends.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func run(t *testing.T, cfg Config) *Result {
	t.Helper()
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = 30 * time.Second
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func TestRunThroughProxy(t *testing.T) {
	e := newLoopbackEnv(t)
	tests := []struct {
		name      string
		cfg       Config
		wantOK    int64
		wantClass Class
		wantBytes int64
		setup     bool
	}{
		{
			name:   "http absolute-form, keep-alive clients",
			cfg:    Config{URL: e.target.URL() + "/bytes/1024", Proxy: e.proxyURL("bench:s3cret"), Requests: 200, Concurrency: 8},
			wantOK: 200, wantBytes: 200 * 1024,
		},
		{
			name:   "https target through CONNECT",
			cfg:    Config{URL: e.tlsTarget.URL() + "/bytes/512", Proxy: e.proxyURL("bench:s3cret"), Requests: 50, Concurrency: 4, Insecure: true},
			wantOK: 50, wantBytes: 50 * 512,
		},
		{
			name:   "method, repeated headers and body reach the target",
			cfg:    Config{URL: e.target.URL() + "/echo", Proxy: e.proxyURL("bench:s3cret"), Requests: 10, Concurrency: 2, Method: "PUT", Body: []byte("0123456789"), Headers: http.Header{"X-A": {"1", "2"}}},
			wantOK: 10, wantBytes: 100,
		},
		{
			name:   "connect mode: a tunnel per request",
			cfg:    Config{Mode: ModeConnect, URL: e.target.URL() + "/bytes/100", Proxy: e.proxyURL("bench:s3cret"), Requests: 30, Concurrency: 4},
			wantOK: 30, wantBytes: 30 * 100, setup: true,
		},
		{
			name:   "connect mode to an https target",
			cfg:    Config{Mode: ModeConnect, URL: e.tlsTarget.URL() + "/bytes/100", Proxy: e.proxyURL("bench:s3cret"), Requests: 10, Concurrency: 2, Insecure: true},
			wantOK: 10, wantBytes: 10 * 100, setup: true,
		},
		{
			name:      "wrong credentials over http are the proxy's 407",
			cfg:       Config{URL: e.target.URL() + "/", Proxy: e.proxyURL("bench:wrong"), Requests: 5, Concurrency: 1},
			wantClass: ClassProxy407,
		},
		{
			name:      "wrong credentials on CONNECT are the proxy's 407",
			cfg:       Config{URL: e.tlsTarget.URL() + "/", Proxy: e.proxyURL("bench:wrong"), Requests: 5, Concurrency: 1, Insecure: true},
			wantClass: ClassProxy407,
		},
		{
			name:      "an untrusted certificate fails without -insecure",
			cfg:       Config{URL: e.tlsTarget.URL() + "/", Proxy: e.proxyURL("bench:s3cret"), Requests: 3, Concurrency: 1},
			wantClass: ClassOther,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := run(t, tt.cfg)
			if tt.wantClass != "" {
				if res.Classes[tt.wantClass] != res.Operations || res.OK != 0 {
					t.Fatalf("classes %v, want all %s", res.Classes, tt.wantClass)
				}
				return
			}
			if res.OK != tt.wantOK || res.Errors() != 0 {
				t.Fatalf("ok %d errors %v, want %d ok", res.OK, res.Classes, tt.wantOK)
			}
			if res.Bytes != tt.wantBytes {
				t.Errorf("bytes %d, want %d", res.Bytes, tt.wantBytes)
			}
			if res.Latency.Count != tt.wantOK || res.Stopped != "requests" {
				t.Errorf("latency count %d, stopped %q", res.Latency.Count, res.Stopped)
			}
			if tt.setup && (res.Setup == nil || res.Setup.Count != tt.wantOK) {
				t.Errorf("setup = %+v, want %d samples", res.Setup, tt.wantOK)
			}
			if res.Proxy != "" && res.Proxy == tt.cfg.Proxy {
				t.Errorf("result keeps the proxy password: %s", res.Proxy)
			}
		})
	}
	// The echo case: the target saw the method, both header values and the body.
	seen := false
	for _, r := range e.target.Received() {
		if r.Method == "PUT" && r.Headers["X-A"] == "1, 2" && r.BodyBytes == 10 {
			seen = true
		}
	}
	if !seen {
		t.Error("the target never received the PUT with its repeated header and body")
	}
}

func TestRunRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	res := run(t, Config{URL: "http://127.0.0.1:9/", Proxy: "http://" + addr, Requests: 3, Concurrency: 1})
	if res.Classes[ClassRefused] != 3 {
		t.Fatalf("classes %v, want 3 refused", res.Classes)
	}
}

func TestRunTunnels(t *testing.T) {
	e := newLoopbackEnv(t)
	res := run(t, Config{
		Mode: ModeTunnels, URL: e.target.URL() + "/bytes/256", Proxy: e.proxyURL("bench:s3cret"),
		Tunnels: 5, TunnelInterval: 50 * time.Millisecond, Duration: 300 * time.Millisecond, Concurrency: 2,
		SUTPIDs: []int{os.Getpid()},
	})
	if res.TunnelsOpened != 5 || res.TunnelsHeld != 5 {
		t.Fatalf("opened %d held %d, want 5 and 5 (classes %v)", res.TunnelsOpened, res.TunnelsHeld, res.Classes)
	}
	// Every tunnel's first request is due within the first interval.
	if res.OK < 5 || res.Errors() != 0 || res.Bytes != res.OK*256 {
		t.Fatalf("ok %d bytes %d classes %v", res.OK, res.Bytes, res.Classes)
	}
	if res.Setup == nil || res.Setup.Count != 5 || !res.Corrected {
		t.Fatalf("setup %+v corrected %v", res.Setup, res.Corrected)
	}
	if got := e.proxy.Connects(); got != 5 {
		t.Errorf("proxy saw %d CONNECTs, want 5", got)
	}
	if res.SUT == nil || res.SUT.Samples < 2 {
		t.Errorf("sut = %+v, want sampled", res.SUT)
	}
}

func TestRunExtract(t *testing.T) {
	var calls atomic.Int64
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Count int `json:"count"`
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		calls.Add(1)
		fmt.Fprintf(w, `{"requested":%d,"returned":%d,"proxies":[]}`, req.Count, req.Count)
	}))
	res := run(t, Config{Mode: ModeExtract, URL: url + "/v1/extract", Requests: 12, Concurrency: 3, ExtractCount: 4})
	if res.OK != 12 || res.ProxiesReturned != 48 || calls.Load() != 12 {
		t.Fatalf("ok %d returned %d calls %d (classes %v)", res.OK, res.ProxiesReturned, calls.Load(), res.Classes)
	}
}

// TestRunCorrectsCoordinatedOmission: the first request stalls; the
// requests that came due meanwhile are charged from their intended time.
func TestRunCorrectsCoordinatedOmission(t *testing.T) {
	const stall = 300 * time.Millisecond
	var n atomic.Int64
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			select {
			case <-time.After(stall):
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	// 100/s with one worker: requests 1..19 are due at 10..190 ms but
	// cannot be sent before the stalled one returns at 300 ms.
	res := run(t, Config{URL: url, Requests: 20, Concurrency: 1, Rate: 100})
	if res.OK != 20 || !res.Corrected {
		t.Fatalf("ok %d corrected %v classes %v", res.OK, res.Corrected, res.Classes)
	}
	if min := float64(stall / time.Millisecond); res.Latency.Max < min {
		t.Errorf("max %.1f ms, want at least the %v stall", res.Latency.Max, stall)
	}
	if res.Latency.P50 < 100 {
		t.Errorf("p50 %.1f ms: the waiting requests were not charged for the stall", res.Latency.P50)
	}
}

// TestRunUnsent: an open loop the server cannot keep up with ends at its
// duration and reports the operations it never sent.
func TestRunUnsent(t *testing.T) {
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-r.Context().Done():
		}
	}))
	res := run(t, Config{URL: url, Duration: 200 * time.Millisecond, Concurrency: 1, Rate: 1000})
	if res.Classes[ClassUnsent] == 0 || res.Stopped != "duration" {
		t.Fatalf("classes %v stopped %q, want unsent operations and a duration stop", res.Classes, res.Stopped)
	}
	if res.Operations != 200 {
		t.Errorf("operations %d, want the 200 the schedule held", res.Operations)
	}
}

func TestRunHardBound(t *testing.T) {
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	res := run(t, Config{URL: url, Requests: 1 << 40, Concurrency: 2, MaxDuration: 200 * time.Millisecond})
	if res.Stopped != "max-duration" || res.OK == 0 {
		t.Fatalf("stopped %q ok %d", res.Stopped, res.OK)
	}
}

func TestRunProgress(t *testing.T) {
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	pr, pw := io.Pipe()
	lines := make(chan string, 1)
	go func() {
		b := make([]byte, 256)
		n, _ := pr.Read(b)
		lines <- string(b[:n])
		_, _ = io.Copy(io.Discard, pr)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Result, 1)
	go func() {
		res, _ := Run(ctx, Config{Scenario: "p", URL: url, Duration: time.Minute, Concurrency: 1, Progress: pw, ProgressInterval: 10 * time.Millisecond})
		done <- res
	}()
	line := <-lines
	cancel()
	res := <-done
	pw.Close()
	if res == nil || res.Stopped != "canceled" {
		t.Fatalf("result %+v, want a canceled run", res)
	}
	if want := "p: "; !strings.Contains(line, want) {
		t.Fatalf("progress line %q lacks %q", line, want)
	}
}

// TestRunBulkTunnel: one tunnel, requests back to back, stops at the
// duration.
func TestRunBulkTunnel(t *testing.T) {
	e := newLoopbackEnv(t)
	res := run(t, Config{Mode: ModeTunnels, URL: e.target.URL() + "/bytes/65536", Proxy: e.proxyURL("bench:s3cret"),
		Tunnels: 1, Duration: 200 * time.Millisecond})
	if res.TunnelsHeld != 1 || res.OK < 1 || res.Bytes != res.OK*65536 || res.Stopped != "duration" || res.Corrected {
		t.Fatalf("held %d ok %d bytes %d stopped %q corrected %v classes %v", res.TunnelsHeld, res.OK, res.Bytes, res.Stopped, res.Corrected, res.Classes)
	}
}

// TestRunSoftStop: canceling stops new work but lets requests in flight
// finish, so nothing is cut.
func TestRunSoftStop(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
			<-release // the first request is in flight when the run is canceled
		default:
		}
		_, _ = io.WriteString(w, "ok")
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Result, 1)
	go func() {
		res, _ := Run(ctx, Config{URL: url, Duration: time.Minute, Concurrency: 1})
		done <- res
	}()
	<-started
	cancel()
	close(release)
	res := <-done
	if res.Stopped != "canceled" || res.Classes[ClassCut] != 0 || res.OK < 1 {
		t.Fatalf("stopped %q classes %v, want a soft stop with the in-flight request done", res.Stopped, res.Classes)
	}
}
