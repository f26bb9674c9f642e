package wasm_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin/wasm"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Sandbox tests: hostile guests try to leave the sandbox or take the host
// down; each attempt is refused or stopped with a clear error, and the
// same plugin serves a good call afterwards.

var sandboxNow = time.Date(2026, 11, 29, 22, 51, 3, 0, time.UTC)

func build(a *wasm.Adapter, mode string, extra ...string) (upstream.Request, error) {
	params := map[string]string{"mode": mode}
	for i := 0; i+1 < len(extra); i += 2 {
		params[extra[i]] = extra[i+1]
	}
	return a.BuildRequest(context.Background(), upstream.BuildInput{Params: params, Now: sandboxNow})
}

func query(t *testing.T, req upstream.Request) url.Values {
	t.Helper()
	u, err := url.Parse(req.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

// checkRecovers asserts the plugin still serves a good call.
func checkRecovers(t *testing.T, a *wasm.Adapter, mode string) {
	t.Helper()
	req, err := build(a, mode)
	if err != nil {
		t.Fatalf("good call after the failure: %v", err)
	}
	if req.URL == "" {
		t.Fatal("good call after the failure returned no url")
	}
}

func TestSandboxReportsWhatTheGuestSees(t *testing.T) {
	t.Parallel()
	a := shared(t, "hostile")
	cases := []struct {
		mode string
		want map[string]string
	}{
		// No environment, no arguments, no working directory.
		{"env", map[string]string{"environ": "0", "args": "0", "home": "", "wd": ""}},
		// stdin is empty.
		{"stdin", map[string]string{"stdin": "0", "stdinerr": "1"}},
		// The wall clock is the fetch time the host passed.
		{"clock", map[string]string{"now": sandboxNow.Format(time.RFC3339Nano), "input": sandboxNow.Format(time.RFC3339Nano)}},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			req, err := build(a, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			q := query(t, req)
			for k, v := range tc.want {
				if got := q.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
	// Sleeping advances the synthetic clock, by the requested time plus
	// 1µs per clock read, without blocking the host.
	t.Run("sleep", func(t *testing.T) {
		req, err := build(a, "sleep")
		if err != nil {
			t.Fatal(err)
		}
		slept, err := time.ParseDuration(query(t, req).Get("slept"))
		if err != nil || slept < 24*time.Hour || slept > 24*time.Hour+time.Second {
			t.Fatalf("slept %s (%v), want 24h and a few microseconds", slept, err)
		}
	})
}

func TestSandboxRefusesIO(t *testing.T) {
	t.Parallel()
	a := shared(t, "hostile")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	cases := []struct {
		mode    string
		extra   []string
		wantErr string
	}{
		{"file", nil, "Bad file number"},
		{"dial", []string{"addr", l.Addr().String()}, "dial tcp " + l.Addr().String()},
		{"resolve", nil, "lookup localhost"},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			before := a.Stats()
			_, err := build(a, tc.mode, tc.extra...)
			var g *wasm.GuestError
			if !errors.As(err, &g) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want a GuestError containing %q", err, tc.wantErr)
			}
			// A refused operation is an ordinary plugin error: the
			// instance stays in the pool.
			if after := a.Stats(); after.Discarded != before.Discarded {
				t.Fatalf("instance discarded: %+v -> %+v", before, after)
			}
			checkRecovers(t, a, "ok")
		})
	}
	// The dial attempt must not have reached the host's network: no
	// connection is pending on the listener.
	if err := l.(*net.TCPListener).SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	if c, err := l.Accept(); err == nil {
		c.Close()
		t.Fatal("the guest reached a host listener")
	}
}

func TestSandboxStopsRunawayGuests(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.CallTimeout = time.Second
	cfg.MaxInstances = 1
	a := load(t, newHost(t, cfg), "hostile")

	cases := []struct {
		mode    string
		target  error
		wantErr string
	}{
		{"loop", wasm.ErrGuestTimeout, "exceeded its deadline"},
		{"goroutine-panic", wasm.ErrGuestCrashed, "panic: boom in a goroutine"},
		{"exit", wasm.ErrGuestCrashed, "exited with code 3"},
		{"trap", wasm.ErrGuestCrashed, "out of bounds memory access"},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			before := a.Stats()
			_, err := build(a, tc.mode)
			if !errors.Is(err, tc.target) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.target, tc.wantErr)
			}
			if strings.Contains(err.Error(), "goroutine 1") || strings.Count(err.Error(), "\n") > 0 {
				t.Fatalf("error quotes a stack dump: %q", err)
			}
			after := a.Stats()
			if after.Discarded != before.Discarded+1 || after.Live != 0 {
				t.Fatalf("stats %+v -> %+v: the failed instance must be discarded", before, after)
			}
			checkRecovers(t, a, "ok")
		})
	}
	t.Run("loop wraps the deadline", func(t *testing.T) {
		_, err := build(a, "loop")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded in the chain", err)
		}
	})
	t.Run("panic in the plugin function is recovered by the sdk", func(t *testing.T) {
		before := a.Stats()
		_, err := build(a, "panic")
		var g *wasm.GuestError
		if !errors.As(err, &g) || !strings.Contains(g.Message, "plugin panicked: boom") {
			t.Fatalf("err = %v, want a GuestError saying the plugin panicked", err)
		}
		if after := a.Stats(); after.Discarded != before.Discarded {
			t.Fatalf("a recovered panic discarded the instance: %+v -> %+v", before, after)
		}
	})
}

func TestSandboxMemoryCeiling(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MemoryLimitPages = 256 // 16 MiB: enough for the Go runtime, quick to exhaust
	a := load(t, newHost(t, cfg), "hostile")
	_, err := build(a, "oom")
	if !errors.Is(err, wasm.ErrGuestCrashed) || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("err = %v, want a crash saying out of memory", err)
	}
	checkRecovers(t, a, "ok")

	t.Run("module larger than the ceiling", func(t *testing.T) {
		cfg := testConfig()
		cfg.MemoryLimitPages = 4 // below the Go runtime's initial memory
		_, err := newHost(t, cfg).Load("hostile", guestBytes(t, "hostile"))
		if err == nil || !strings.Contains(err.Error(), "compiling wasm module") {
			t.Fatalf("err = %v, want a compile error", err)
		}
	})
}

func TestMalformedOutput(t *testing.T) {
	t.Parallel()
	a := load(t, newHost(t, testConfig()), "rawabi")
	build := []struct {
		mode    string
		target  error
		wantErr string
	}{
		{"badjson", wasm.ErrBadOutput, "proxypool_build_request: malformed wasm guest output: unexpected EOF"},
		{"trailing", wasm.ErrBadOutput, "trailing data"},
		{"unknownfield", wasm.ErrBadOutput, `unknown field "extra"`},
		{"both", wasm.ErrBadOutput, "both request and error"},
		{"neither", wasm.ErrBadOutput, "neither request nor error"},
		{"badkind", wasm.ErrBadOutput, `unknown error kind "weird"`},
		{"oob", wasm.ErrBadOutput, "lies outside memory"},
		{"wrap", wasm.ErrBadOutput, "lies outside memory"},
		{"oversize", wasm.ErrBadOutput, "more than 16777216"},
		{"zero", wasm.ErrBadOutput, "returned no output"},
		{"panic", wasm.ErrGuestCrashed, "panic: raw boom"},
		{"exit0", wasm.ErrGuestCrashed, "exited with code 0"},
	}
	for _, tc := range build {
		t.Run("build/"+tc.mode, func(t *testing.T) {
			before := a.Stats()
			_, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"mode": tc.mode}})
			if !errors.Is(err, tc.target) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.target, tc.wantErr)
			}
			if after := a.Stats(); after.Discarded != before.Discarded+1 {
				t.Fatalf("stats %+v -> %+v: the instance must be discarded", before, after)
			}
			checkRecovers(t, a, "ok")
		})
	}
	t.Run("build/guest errors", func(t *testing.T) {
		_, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"mode": "badrequest"}})
		var g *wasm.GuestError
		if !errors.As(err, &g) || !strings.Contains(g.Message, `invalid request: url scheme "file"`) {
			t.Fatalf("err = %v, want a GuestError about the url", err)
		}
		_, err = a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"mode": "ctlmessage"}})
		if !errors.As(err, &g) || strings.ContainsAny(g.Message, "\n\x00") || len(g.Message) > 260 || !strings.HasPrefix(g.Message, "line1 line2 xxx") {
			t.Fatalf("err = %q, want a bounded message without control characters", err)
		}
	})
	t.Run("build/alloc outside memory", func(t *testing.T) {
		if _, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"mode": "badalloc-next"}}); err != nil {
			t.Fatal(err)
		}
		_, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"mode": "ok"}})
		if !errors.Is(err, wasm.ErrBadOutput) || !strings.Contains(err.Error(), "proxypool_alloc") {
			t.Fatalf("err = %v, want a bad output from proxypool_alloc", err)
		}
		checkRecovers(t, a, "ok")
	})

	parse := []struct {
		mode      string
		target    error
		entry     bool
		wantErr   string
		wantRetry time.Duration
	}{
		{mode: "badport", entry: true, wantErr: "proxy 1: field port: 70000 is not a port"},
		{mode: "badhost", entry: true, wantErr: "proxy 0: field host"},
		{mode: "wrongtype", target: wasm.ErrBadOutput, wantErr: "proxy 0: json: cannot unmarshal string"},
		{mode: "unknownproxyfield", target: wasm.ErrBadOutput, wantErr: `unknown field "ttl"`},
		{mode: "negativeretry", target: wasm.ErrBadOutput, wantErr: "retryAfterSeconds -1"},
		{mode: "badstatus", target: wasm.ErrBadOutput, wantErr: "status error with status 42"},
		{mode: "toomany", wantErr: "10001 proxies, more than 10000"},
		{mode: "hugeretry", wantRetry: time.Hour},
	}
	for _, tc := range parse {
		t.Run("parse/"+tc.mode, func(t *testing.T) {
			res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Params: map[string]string{"mode": tc.mode}}, sandboxNow)
			if tc.wantErr == "" {
				if err != nil || res.RetryAfter != tc.wantRetry {
					t.Fatalf("res = %+v, err = %v; want retry %s", res, err, tc.wantRetry)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
			if tc.target != nil && !errors.Is(err, tc.target) {
				t.Fatalf("err = %v, want %v", err, tc.target)
			}
			var ee *wasm.EntryError
			if tc.entry != errors.As(err, &ee) {
				t.Fatalf("err = %v (%T): EntryError %v", err, err, tc.entry)
			}
			if len(res.Proxies) != 0 {
				t.Fatalf("a failed parse returned %d proxies", len(res.Proxies))
			}
		})
	}
}

func TestLoadRefusesModules(t *testing.T) {
	t.Parallel()
	h := newHost(t, testConfig())
	cases := []struct {
		name  string
		data  func(t *testing.T) []byte
		abi   bool
		wants []string
	}{
		{"wrong abi version", func(t *testing.T) []byte { return guestBytes(t, "wrongabi") }, true,
			[]string{"proxypool_abi_version returned 2, this host implements 1"}},
		{"command module", func(t *testing.T) []byte { return guestBytes(t, "command") }, true,
			[]string{"is a command module", "-buildmode=c-shared"}},
		{"foreign imports", func(t *testing.T) []byte { return guestBytes(t, "badimport") }, true,
			[]string{"imports function env.launch_missiles: only wasi_snapshot_preview1 functions are provided",
				"imports wasi_snapshot_preview1.sock_open, which this host does not provide"}},
		{"missing and mistyped exports", func(t *testing.T) []byte { return guestBytes(t, "missingexport") }, true,
			[]string{"does not export function proxypool_parse_response", "exports proxypool_free with type (i32) -> (), want (i32, i32) -> ()"}},
		{"not wasm", func(*testing.T) []byte { return []byte("abi: 1\nname: x\n") }, false, []string{"compiling wasm module"}},
		{"empty", func(*testing.T) []byte { return nil }, false, []string{"compiling wasm module"}},
		{"truncated", func(t *testing.T) []byte { b := guestBytes(t, "rawabi"); return b[:len(b)/2] }, false, []string{"compiling wasm module"}},
		{"too large", func(*testing.T) []byte { return make([]byte, wasm.MaxModuleBytes+1) }, false, []string{"larger than"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Load(tc.name, tc.data(t))
			if err == nil {
				t.Fatal("loaded")
			}
			if errors.Is(err, wasm.ErrABI) != tc.abi {
				t.Fatalf("err = %v: ErrABI %v", err, tc.abi)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestPoolBoundsConcurrency(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxInstances = 2
	a := load(t, newHost(t, cfg), "tck")
	const calls = 12
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		go func() {
			_, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"a": "x"}, Now: sandboxNow})
			errs <- err
		}()
	}
	for i := 0; i < calls; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s := a.Stats()
	if s.Created > 2 || s.Live > 2 || s.Discarded != 0 || s.Idle != s.Live {
		t.Fatalf("stats %+v: want at most 2 instances, none discarded, all idle", s)
	}
}

func TestCancelledCall(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxInstances = 1
	cfg.CallTimeout = 5 * time.Second
	a := load(t, newHost(t, cfg), "hostile")

	// The only instance is busy looping; a caller that gives up while
	// waiting for it gets its own context error.
	looping := make(chan error, 1)
	go func() {
		_, err := build(a, "loop")
		looping <- err
	}()
	waitBusy(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.BuildRequest(ctx, upstream.BuildInput{Params: map[string]string{"mode": "ok"}})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, wasm.ErrGuestTimeout) {
		t.Fatalf("err = %v, want the caller's deadline while waiting for an instance", err)
	}
	if err := <-looping; !errors.Is(err, wasm.ErrGuestTimeout) {
		t.Fatalf("loop: err = %v", err)
	}

	// A caller cancelling mid-call stops the guest and is told so.
	checkRecovers(t, a, "ok") // an idle instance again
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		waitBusy(t, a)
		cancel()
	}()
	_, err = a.BuildRequest(ctx, upstream.BuildInput{Params: map[string]string{"mode": "loop"}})
	if !errors.Is(err, context.Canceled) || errors.Is(err, wasm.ErrGuestCrashed) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	checkRecovers(t, a, "ok")
}

// waitBusy polls until the single instance of a's pool is taken by a call.
func waitBusy(t *testing.T, a *wasm.Adapter) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s := a.Stats(); s.Live == 1 && s.Idle == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Error("the call never took the instance")
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	a := load(t, newHost(t, testConfig()), "tck")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"a": "x"}})
	if !errors.Is(err, wasm.ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
	if s := a.Stats(); s.Live != 0 {
		t.Fatalf("stats after close %+v", s)
	}
}

func TestConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  wasm.Config
		ok   bool
	}{
		{"zero is defaults", wasm.Config{}, true},
		{"memory above the bound", wasm.Config{MemoryLimitPages: wasm.MaxMemoryLimitPages + 1}, false},
		{"negative timeout", wasm.Config{CallTimeout: -1}, false},
		{"too many instances", wasm.Config{MaxInstances: wasm.MaxInstancesLimit + 1}, false},
		{"cache dir", wasm.Config{CacheDir: filepath.Join(t.TempDir(), "cache")}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := wasm.NewHost(context.Background(), tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, ok %v", err, tc.ok)
			}
			if err != nil {
				return
			}
			defer h.Close(context.Background())
			c := h.Config()
			if c.MemoryLimitPages == 0 || c.CallTimeout == 0 || c.InitTimeout == 0 || c.MaxInstances == 0 {
				t.Fatalf("defaults not applied: %+v", c)
			}
			if tc.cfg.CacheDir != "" {
				if _, err := os.Stat(tc.cfg.CacheDir); err != nil {
					t.Fatalf("cache dir: %v", err)
				}
			}
		})
	}
}

// TestInterpreter runs the kit on wazero's interpreter, the engine of
// platforms without the compiler. Skipped under the race detector, where
// interpreting a Go guest is too slow to be worth the minutes.
func TestInterpreter(t *testing.T) {
	if raceEnabled {
		t.Skip("slow under the race detector; the compiler path is covered")
	}
	t.Parallel()
	cfg := testConfig()
	cfg.Interpreter = true
	cfg.CacheDir = ""
	a := load(t, newHost(t, cfg), "tck")
	req, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"a": "x"}, Count: 2, Now: sandboxNow})
	if err != nil || !strings.Contains(req.URL, "count=2") {
		t.Fatalf("req = %+v, err = %v", req, err)
	}
	res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Body: []byte(`[{"host":"203.0.113.1","port":80}]`), Params: map[string]string{"mode": "proxies"}}, sandboxNow)
	if err != nil || len(res.Proxies) != 1 {
		t.Fatalf("res = %+v, err = %v", res, err)
	}
}
