package testenv

import (
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"
)

// fakeTB captures Skip/Fatal so tests can check how the Start functions
// react to their environment. Skipf and Fatalf end the calling goroutine
// like the real ones, so the code under test must run via runFake.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	outcome  string // "", "skip" or "fatal"
	msg      string
	cleanups []func()
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

func (f *fakeTB) Skipf(format string, args ...any) { f.end("skip", format, args...) }

func (f *fakeTB) Fatalf(format string, args ...any) { f.end("fatal", format, args...) }

func (f *fakeTB) end(outcome, format string, args ...any) {
	f.mu.Lock()
	f.outcome, f.msg = outcome, fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// runFake runs fn with a fakeTB on its own goroutine, then runs its cleanups.
func runFake(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f
}

// directClient never consults proxy environment variables.
var directClient = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
}

func TestFreePort(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listening on free port %d: %v", port, err)
	}
	ln.Close()
}

func TestListenLoopbackRefusesOtherAddresses(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "example.com:80"} {
		if ln, err := listenLoopback(addr, ""); err == nil {
			ln.Close()
			t.Errorf("listenLoopback(%q) succeeded, want refusal", addr)
		}
	}
}
