package provider

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/testenv"
)

// quotingAdapter is a vendor adapter whose parse errors quote the body, as
// real plugins do ("bad line ...").
type quotingAdapter struct{ ctltest.VendorAdapter }

func (quotingAdapter) ParseResponse(_ context.Context, resp upstream.Response, _ time.Time) (upstream.ParseResult, error) {
	return upstream.ParseResult{}, fmt.Errorf("bad body %q", resp.Body)
}

func TestParseFailureKeepsNoResponseText(t *testing.T) {
	v := startVendor(t, 5) // proxies 127.0.0.1:20000.. with password pw-secret
	logs := &ctltest.LogBuffer{}
	f := newFixture(t, upCfg(t, v.URL()), &quotingAdapter{}, func(o *RuntimeOptions) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	f.rt.fetch(context.Background(), Grant{Count: 3})
	st := f.rt.Status()
	if st.LastOutcome != "error" || st.LastError != kindParse {
		t.Fatalf("status = %+v, want a parse Error", st)
	}
	for _, leak := range []string{"pw-secret", "20000", "k-123"} {
		if strings.Contains(st.LastError, leak) || strings.Contains(logs.String(), leak) {
			t.Fatalf("%q kept after the call: status %q, logs %q", leak, st.LastError, logs.String())
		}
	}
}

func TestDepletionRetriedUntilRecorded(t *testing.T) {
	v := startVendor(t, 10)
	f := newFixture(t, upCfg(t, v.URL()), nil, nil) // emptyThreshold 2
	ctx := context.Background()
	f.hooks.failDepleted.Store(true)
	v.SetMode(testenv.VendorEmpty)
	f.rt.fetch(ctx, Grant{Count: 3})
	f.rt.fetch(ctx, Grant{Count: 3})
	if f.hooks.attempts.Load() != 1 || !f.rt.Status().DepletionPending {
		t.Fatalf("attempts %d, status %+v: the failed switch must stay pending", f.hooks.attempts.Load(), f.rt.Status())
	}
	f.rt.retryDepletion(ctx) // still down
	if f.hooks.attempts.Load() != 2 || f.hooks.depleted.Load() != 0 {
		t.Fatal("the depletion was not retried")
	}
	f.hooks.failDepleted.Store(false) // the store is back
	f.rt.Refill(ctx)
	f.rt.wg.Wait()
	if f.hooks.depleted.Load() != 1 || f.rt.Status().DepletionPending {
		t.Fatalf("depleted %d, status %+v after the store came back", f.hooks.depleted.Load(), f.rt.Status())
	}
	attempts := f.hooks.attempts.Load()
	f.rt.retryDepletion(ctx)
	if f.hooks.attempts.Load() != attempts {
		t.Fatal("a recorded depletion was sent again")
	}
	// A pending depletion is dropped when the run of empties ends.
	f.hooks.failDepleted.Store(true)
	v.SetMode(testenv.VendorNormal)
	f.rt.fetch(ctx, Grant{Count: 3})
	v.SetMode(testenv.VendorEmpty)
	f.rt.fetch(ctx, Grant{Count: 3})
	f.rt.fetch(ctx, Grant{Count: 3})
	if !f.rt.Status().DepletionPending {
		t.Fatal("second depletion not pending")
	}
	v.SetMode(testenv.VendorNormal)
	f.rt.fetch(ctx, Grant{Count: 3})
	if f.rt.Status().DepletionPending {
		t.Fatal("a success did not end the pending depletion")
	}
}

func TestDedupeAcrossUpstreams(t *testing.T) {
	v := startVendor(t, 5)
	now := time.Now()
	clock := func() time.Time { return now }
	pool := embedded.NewPool(embedded.PoolOptions{Now: clock})
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	mk := func(name string) *Runtime {
		up := upCfg(t, v.URL())
		up.Name = name
		return NewRuntime(RuntimeOptions{Upstream: up, AllowLoopback: true, Adapter: &ctltest.VendorAdapter{}, Store: pool, Metrics: m, Now: clock})
	}
	a, b := mk("vendor-a"), mk("vendor-b")
	ctx := context.Background()
	a.fetch(ctx, Grant{Count: 5})
	first, _ := pool.List(ctx, activitypool.Filter{})
	if len(first) != 5 {
		t.Fatalf("pool has %d", len(first))
	}
	now = now.Add(time.Minute)
	b.fetch(ctx, Grant{Count: 5}) // the same five proxies from another vendor
	if st := b.Status(); st.LastOutcome != "duplicate_only" || st.TotalFetched != 0 {
		t.Fatalf("second source = %+v, want duplicate_only", st)
	}
	if got := testutil.ToFloat64(m.duplicates.WithLabelValues("vendor-b")); got != 5 {
		t.Fatalf("duplicates_total{vendor-b} = %v", got)
	}
	after, _ := pool.List(ctx, activitypool.Filter{})
	for i := range after {
		if after[i].Upstream != "vendor-a" || !after[i].ExpiresAt.Equal(first[i].ExpiresAt) {
			t.Fatalf("a duplicate took over or refreshed %s: %+v", after[i].ID, after[i])
		}
		if want := after[i].ExpiresAt.Add(-10 * time.Second); !after[i].UsableUntil.Equal(want) {
			t.Fatalf("usable until %s, want expires - allocationSafetyMargin = %s", after[i].UsableUntil, want)
		}
	}
	// After the first lifecycle's hard expiry the key may move.
	now = first[0].ExpiresAt.Add(time.Second)
	b.fetch(ctx, Grant{Count: 5})
	moved, _ := pool.List(ctx, activitypool.Filter{Upstream: "vendor-b"})
	if len(moved) != 5 || b.Status().LastOutcome != "success" {
		t.Fatalf("after hard expiry vendor-b owns %d, outcome %s", len(moved), b.Status().LastOutcome)
	}
}

func TestPrecheck(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name      string
		url       string
		loopback  bool
		wantError string
	}{
		{"public name", "http://vendor.example/api", false, ""},
		{"loopback allowed", "http://127.0.0.1:9/api", true, ""},
		{"loopback refused", "http://127.0.0.1:9/api", false, "loopback"},
		{"private refused", "http://10.1.2.3/api", true, "not a public address"},
		{"metadata refused", "http://169.254.169.254/latest", true, "not a public address"},
		{"bad scheme", "ftp://vendor.example/", false, "not http or https"},
		{"no url param", "", false, "url is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := upCfg(t, "")
			up.Provider.Params = config.StringMap{}
			if tc.url != "" {
				up.Provider.Params["url"] = tc.url
			}
			err := Precheck(up, &ctltest.VendorAdapter{}, tc.loopback, now)
			if tc.wantError == "" && err != nil {
				t.Fatalf("Precheck = %v", err)
			}
			if tc.wantError != "" && (err == nil || !strings.Contains(err.Error(), tc.wantError)) {
				t.Fatalf("Precheck = %v, want an error mentioning %q", err, tc.wantError)
			}
		})
	}
}

func TestMaxInFlightRunsCallsInParallel(t *testing.T) {
	v := startVendor(t, 40)
	v.SetMode(testenv.VendorSlow) // 300ms per call
	up := upCfg(t, v.URL())
	up.Fetch.MaxInFlight = 2
	up.Fetch.EstimatedIPsPerCall = 2 // target 6: three calls wanted
	f := newFixture(t, up, nil, func(o *RuntimeOptions) { o.Tick = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.rt.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !ctltest.Eventually(5*time.Second, func() bool { return f.rt.Status().InFlight == 2 }) {
		t.Fatalf("status = %+v, want two calls in flight", f.rt.Status())
	}
	if !ctltest.Eventually(5*time.Second, func() bool { return len(f.list(t)) == 6 }) {
		t.Fatalf("pool has %d, want 6", len(f.list(t)))
	}
}

func TestSupervisorKeepsCountersAndRepairsLostNotifications(t *testing.T) {
	v := startVendor(t, 40)
	mgmt, err := embedded.OpenManagement(t.TempDir(), embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.Close() })
	a := upCfg(t, v.URL())
	cfg := &config.Config{Upstreams: []config.Upstream{a}, Security: config.Security{AllowLoopbackDestinations: true}}
	providers := ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}
	s := NewSupervisor(SupervisorOptions{
		Store: embedded.NewPool(embedded.PoolOptions{}), Overrides: mgmt,
		Registry: prometheus.NewRegistry(), Tick: 10 * time.Millisecond, ReconcileEvery: 20 * time.Millisecond,
	})
	if err := s.Update(cfg, providers); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !ctltest.Eventually(5*time.Second, func() bool { st, _ := s.Status("vendor-a"); return st.Calls >= 2 }) {
		t.Fatal("no fetches")
	}
	calls := func() int64 { st, _ := s.Status("vendor-a"); return st.Calls }
	before := calls()

	// A reload that replaces the runtime keeps the cumulative counters.
	a2 := a
	a2.Fetch.EstimatedIPsPerCall = 4
	if err := s.Update(&config.Config{Upstreams: []config.Upstream{a2}, Security: cfg.Security}, providers); err != nil {
		t.Fatal(err)
	}
	if got := calls(); got < before {
		t.Fatalf("calls went from %d to %d across a runtime replacement", before, got)
	}
	// A reload whose new runtime fails its pre-check keeps the old one.
	broken := a2
	broken.Fetch.EstimatedIPsPerCall = 3
	broken.Provider.Params = config.StringMap{"url": "http://10.0.0.1/api"}
	if err := s.Update(&config.Config{Upstreams: []config.Upstream{broken}, Security: cfg.Security}, providers); err == nil || !strings.Contains(err.Error(), "pre-checking") {
		t.Fatalf("update with a private vendor address = %v", err)
	}
	s.mu.Lock()
	kept := s.specs["vendor-a"].up.Fetch.EstimatedIPsPerCall == 4
	s.mu.Unlock()
	if !kept {
		t.Fatal("a failed pre-check replaced the spec")
	}

	// An override written while the notification was lost: the reconcile
	// loop finds it and stops the runtime; the counters stay visible.
	if err := mgmt.SetUpstreamEnabled(context.Background(), "vendor-a", false); err != nil {
		t.Fatal(err)
	}
	if !ctltest.Eventually(5*time.Second, func() bool { return len(s.Running()) == 0 }) {
		t.Fatal("the reconcile loop did not stop a runtime disabled behind its back")
	}
	if st, running := s.Status("vendor-a"); running || st.Calls < before {
		t.Fatalf("disabled status = %+v running %v, want the last counters", st, running)
	}
	if err := mgmt.SetUpstreamEnabled(context.Background(), "vendor-a", true); err != nil {
		t.Fatal(err)
	}
	if !ctltest.Eventually(5*time.Second, func() bool { return len(s.Running()) == 1 }) {
		t.Fatal("the reconcile loop did not restart a re-enabled runtime")
	}
}

// fixedInventory reports a saturated pool: proxies exist, no free slot.
type fixedInventory struct{ inv upstream.Inventory }

func (f fixedInventory) Inventory(context.Context, string, time.Time) (upstream.Inventory, error) {
	return f.inv, nil
}

func TestRuntimePlansFromInventorySource(t *testing.T) {
	v := startVendor(t, 40)
	up := upCfg(t, v.URL()) // minimum 3, target 6
	// The store would say 6 usable proxies; the inventory reader says the
	// gateway saturates them all: none available, so the runtime refills.
	f := newFixture(t, up, nil, func(o *RuntimeOptions) {
		o.Inventory = fixedInventory{upstream.Inventory{Managed: 6, Available: 0, AvailableSlots: 0}}
	})
	f.rt.Refill(context.Background())
	f.rt.wg.Wait()
	if v.Calls() != 1 {
		t.Fatalf("vendor calls %d, want a refill for a saturated pool", v.Calls())
	}
}
