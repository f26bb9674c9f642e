package provider

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
)

func TestSupervisorLifecycle(t *testing.T) {
	v := startVendor(t, 40)
	mgmt, err := embedded.OpenManagement(t.TempDir(), embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.Close() })
	ctx := context.Background()
	// An admin disabled vendor-c before this process started.
	if err := mgmt.SetUpstreamEnabled(ctx, "vendor-c", false); err != nil {
		t.Fatal(err)
	}
	off := false
	a := upCfg(t, v.URL())
	b := upCfg(t, v.URL())
	b.Name, b.Enabled = "vendor-b", &off
	c := upCfg(t, v.URL())
	c.Name = "vendor-c"
	cfg := &config.Config{Upstreams: []config.Upstream{a, b, c}, Security: config.Security{AllowLoopbackDestinations: true}}
	adapter := &ctltest.VendorAdapter{}
	providers := ctltest.Providers{"vendor": adapter}

	s := NewSupervisor(SupervisorOptions{
		Store: embedded.NewPool(embedded.PoolOptions{}), Overrides: mgmt,
		Registry: prometheus.NewRegistry(), Tick: 10 * time.Millisecond,
	})
	if err := s.Update(cfg, providers); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Run(runCtx); close(done) }()
	defer func() {
		cancel()
		<-done
		if got := s.Running(); len(got) != 0 {
			t.Errorf("runtimes left after Run returned: %v", got)
		}
	}()

	expect := func(want ...string) {
		t.Helper()
		if !ctltest.Eventually(5*time.Second, func() bool {
			got := s.Running()
			return len(got) == len(want) && (len(got) == 0 || reflect.DeepEqual(got, want))
		}) {
			t.Fatalf("running = %v, want %v", s.Running(), want)
		}
	}
	expect("vendor-a")
	if s.Enabled("vendor-b") || s.Enabled("vendor-c") || !s.Enabled("vendor-a") {
		t.Fatal("enabled view wrong")
	}

	s.SetEnabled("vendor-b", true) // the configuration is the authority
	s.SetEnabled("vendor-c", true) // an admin re-enables what an admin disabled
	expect("vendor-a", "vendor-c")
	s.SetEnabled("vendor-a", false)
	s.SetEnabled("vendor-c", false)
	expect()
	// Enable vendor-b in the configuration.
	b.Enabled = nil
	if err := s.Update(&config.Config{Upstreams: []config.Upstream{a, b, c}, Security: cfg.Security}, providers); err != nil {
		t.Fatal(err)
	}
	expect("vendor-b")

	// A reload that changes fetch settings replaces the runtime.
	s.mu.Lock()
	oldB := s.runs["vendor-b"].rt
	s.mu.Unlock()
	b2 := b
	b2.Fetch.EstimatedIPsPerCall = 2
	cfg2 := &config.Config{Upstreams: []config.Upstream{a, b2, c}, Security: cfg.Security}
	if err := s.Update(cfg2, providers); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	newB := s.runs["vendor-b"].rt
	s.mu.Unlock()
	if newB == oldB {
		t.Fatal("fetch change did not replace the runtime")
	}
	// A change of check policy alone keeps it.
	b3 := b2
	b3.Check.Interval = time.Minute
	if err := s.Update(&config.Config{Upstreams: []config.Upstream{a, b3, c}, Security: cfg.Security}, providers); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	same := s.runs["vendor-b"].rt == newB
	s.mu.Unlock()
	if !same {
		t.Fatal("a check-only change replaced the runtime")
	}

	// An unresolvable plugin refuses the whole update and keeps the old.
	bad := b3
	bad.Provider.Plugin = "missing"
	if err := s.Update(&config.Config{Upstreams: []config.Upstream{a, bad}, Security: cfg.Security}, providers); err == nil {
		t.Fatal("update with a missing plugin succeeded")
	}
	expect("vendor-b")

	// A replacement that fails its pre-check is never published: the old
	// runtime keeps running, untouched.
	unsafe := b3
	unsafe.Fetch.EstimatedIPsPerCall = 3
	unsafe.Provider.Params = config.StringMap{"url": "ftp://vendor.example/"}
	err = s.Update(&config.Config{Upstreams: []config.Upstream{a, unsafe, c}, Security: cfg.Security}, providers)
	if err == nil || !strings.Contains(err.Error(), "pre-checking provider") {
		t.Fatalf("update with a failing pre-check = %v", err)
	}
	s.mu.Lock()
	kept := s.runs["vendor-b"].rt == newB
	s.mu.Unlock()
	if !kept {
		t.Fatal("a runtime that failed its pre-check replaced the old one")
	}
	expect("vendor-b")

	// Removing an upstream stops its runtime.
	if err := s.Update(&config.Config{Upstreams: []config.Upstream{a}, Security: cfg.Security}, providers); err != nil {
		t.Fatal(err)
	}
	expect()
}

func TestSpecSame(t *testing.T) {
	up := upCfg(t, "http://127.0.0.1:1")
	a1, a2 := &ctltest.VendorAdapter{}, &ctltest.VendorAdapter{}
	base := &spec{up: up, adapter: a1}
	cases := []struct {
		name   string
		mutate func(s *spec)
		same   bool
	}{
		{"identical", func(*spec) {}, true},
		{"check only", func(s *spec) { s.up.Check.Timeout = time.Hour }, true},
		{"params", func(s *spec) { s.up.Provider.Params = config.StringMap{"url": "http://127.0.0.1:2"} }, false},
		{"pool", func(s *spec) { s.up.Pool.Target++ }, false},
		{"rebuilt adapter", func(s *spec) { s.adapter = a2 }, false},
		{"loopback flag", func(s *spec) { s.allowLoopback = true }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			other := *base
			other.up.Provider.Params = config.StringMap{"url": up.Provider.Params["url"]}
			tc.mutate(&other)
			if got := base.same(&other); got != tc.same {
				t.Fatalf("same = %v, want %v", got, tc.same)
			}
		})
	}
}
