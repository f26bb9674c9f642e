package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/testenv"
)

// Seed 000 §18, the rows the controller owns, on the embedded stores.

// Provider timeout / 500: Error and backoff; not Empty; existing proxies
// untouched.
func TestFaultProviderErrorBacksOffAndKeepsProxies(t *testing.T) {
	cases := []struct {
		name    string
		mode    testenv.VendorMode
		lastErr string
	}{
		{"500", testenv.VendorError500, "provider answered HTTP 500"},
		{"timeout", testenv.VendorSlow, "calling provider timed out"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := startUpstreams(t, 3)
			v := startVendor(t, ps) // slow mode waits 5s, far past the 300ms timeout
			// A second upstream for the sequential routing, never fetched from.
			cfg := parseConfig(t, fmt.Sprintf(`
  - name: vendor-a
    provider: {plugin: vendor, params: {url: "%s/v1/proxies"}}
    fetch: {requestInterval: 10ms, timeout: 300ms, emptyThreshold: 1, estimatedIPsPerCall: 3, backoff: {initial: 20s, max: 40s}}
    pool: {minimum: 2, target: 3, maxSize: 10}
    check: {interval: 1h, timeout: 2s}
  - name: spare
    enabled: false
    provider: {plugin: vendor, params: {url: "%s/v1/proxies"}}`, v.URL(), v.URL()), `
  - name: seq
    strategy: sequential
    upstreams: [vendor-a, spare]`)
			wd := startWorld(t, cfg, nil)
			ctx := context.Background()
			within(t, "three proxies published", func() bool { s := wd.w.Last(); return s != nil && len(s.Proxies) == 3 })
			v.SetMode(tc.mode)
			// Take two: below the minimum, so the runtime calls the vendor.
			res, err := wd.c.Extract(ctx, extraction.Request{Client: "c", Count: 2})
			if err != nil || res.Returned != 2 {
				t.Fatalf("extract = %+v, %v", res, err)
			}
			left, _ := wd.pool.List(ctx, activitypool.Filter{States: []proxy.State{proxy.StateAvailable}})
			if len(left) != 1 {
				t.Fatalf("%d left", len(left))
			}
			within(t, "the failed call classified", func() bool {
				us, _ := wd.c.Upstreams(ctx)
				return us[0].Fetch.Errors >= 1
			})
			us, err := wd.c.Upstreams(ctx)
			if err != nil {
				t.Fatal(err)
			}
			f := us[0].Fetch
			if f.LastOutcome != "error" || f.LastError != tc.lastErr || f.Empty != 0 || f.ConsecutiveEmpty != 0 || f.ConsecutiveError < 1 {
				t.Fatalf("fetch status = %+v", f)
			}
			if f.BackoffUntil == nil || !f.BackoffUntil.After(time.Now().Add(10*time.Second)) {
				t.Fatalf("backoff not reported: %+v", f.BackoffUntil)
			}
			// An error never switches a routing, and the proxy we had is
			// as it was.
			if rs, _ := wd.c.Routings(ctx); rs[0].Generation != 0 {
				t.Fatalf("an Error switched the routing: %+v", rs[0])
			}
			p, err := wd.pool.Get(ctx, left[0].ID)
			if err != nil || p.State != proxy.StateAvailable || !p.ExpiresAt.Equal(left[0].ExpiresAt) {
				t.Fatalf("existing proxy after the error = %+v, %v", p, err)
			}
			if !wd.w.Has(left[0].ID) {
				t.Fatal("the existing proxy left the snapshot")
			}
		})
	}
}

// Provider legal empty: Empty++ and, at the threshold, the switch (the
// admin half is TestControllerSequentialFailoverAndAdmin).
func TestFaultLegalEmptySwitchesAtThreshold(t *testing.T) {
	ps := startUpstreams(t, 2)
	va, vb := startVendor(t, nil), startVendor(t, ps)
	va.SetMode(testenv.VendorEmpty)
	cfg := parseConfig(t, upstreamYAML("vendor-a", va.URL())+upstreamYAML("vendor-b", vb.URL()), `
  - name: seq
    strategy: sequential
    upstreams: [vendor-a, vendor-b]`)
	wd := startWorld(t, cfg, nil)
	ctx := context.Background()
	within(t, "the switch to vendor-b", func() bool { s := wd.w.Last(); return s != nil && s.Cursors["seq"] == 1 })
	us, _ := wd.c.Upstreams(ctx)
	if us[0].Fetch.Empty < 2 || us[0].Fetch.Errors != 0 {
		t.Fatalf("vendor-a fetch = %+v", us[0].Fetch)
	}
	if got := wd.metric(t, "proxypool_routing_switches_total", map[string]string{"routing": "seq", "reason": "depleted"}); got != 1 {
		t.Fatalf("switches = %v, want 1", got)
	}
}

// All upstreams unavailable: the snapshot still carries the routing with
// its onUnavailable policy and no candidate; the gateway applies it.
func TestFaultAllUpstreamsUnavailable(t *testing.T) {
	v := startVendor(t, nil)
	v.SetMode(testenv.VendorError500)
	cfg := parseConfig(t, upstreamYAML("vendor-a", v.URL()), `
  - name: r
    upstreams: [vendor-a]
    onUnavailable: wait`)
	wd := startWorld(t, cfg, nil)
	ctx := context.Background()
	within(t, "a snapshot", func() bool { s := wd.w.Last(); return s != nil && s.Version >= 2 })
	s := wd.w.Last()
	if len(s.Routings) != 1 || s.Routings[0].Name != "r" || s.Routings[0].OnUnavailable != routing.Wait || len(s.Proxies) != 0 {
		t.Fatalf("snapshot = %+v", s)
	}
	if wd.c.Ready() {
		t.Fatal("ready with no proxy at all")
	}
	// Disabled: the same, and the snapshot says why.
	if err := wd.c.SetUpstreamEnabled(ctx, "ops", "vendor-a", false); err != nil {
		t.Fatal(err)
	}
	within(t, "the disabled upstream in the snapshot", func() bool { return wd.w.Last().Disabled["vendor-a"] })
	if s := wd.w.Last(); len(s.Routings) != 1 || s.Routings[0].OnUnavailable != routing.Wait {
		t.Fatalf("snapshot = %+v", s)
	}
}

// downStore wraps the management store with an outage switch: while down,
// every call fails as a PostgreSQL connection would.
type downSwitch struct {
	management.Store
	down atomic.Bool
}

var errConnRefused = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")

func (d *downSwitch) UpstreamEnabled(ctx context.Context, name string) (bool, bool, error) {
	if d.down.Load() {
		return false, false, errConnRefused
	}
	return d.Store.UpstreamEnabled(ctx, name)
}

func (d *downSwitch) SetUpstreamEnabled(ctx context.Context, name string, on bool) error {
	if d.down.Load() {
		return errConnRefused
	}
	return d.Store.SetUpstreamEnabled(ctx, name, on)
}

func (d *downSwitch) Cursor(ctx context.Context, r string) (routing.Cursor, error) {
	if d.down.Load() {
		return routing.Cursor{}, errConnRefused
	}
	return d.Store.Cursor(ctx, r)
}

func (d *downSwitch) CompareAndSetCursor(ctx context.Context, r string, old, next routing.Cursor) (bool, error) {
	if d.down.Load() {
		return false, errConnRefused
	}
	return d.Store.CompareAndSetCursor(ctx, r, old, next)
}

func (d *downSwitch) AppendAudit(ctx context.Context, e management.AuditEntry) error {
	if d.down.Load() {
		return errConnRefused
	}
	return d.Store.AppendAudit(ctx, e)
}

func (d *downSwitch) ListAudit(ctx context.Context, n int) ([]management.AuditEntry, error) {
	if d.down.Load() {
		return nil, errConnRefused
	}
	return d.Store.ListAudit(ctx, n)
}

func (d *downSwitch) RecordRevision(ctx context.Context, r management.Revision) error {
	if d.down.Load() {
		return errConnRefused
	}
	return d.Store.RecordRevision(ctx, r)
}

// Management store (PostgreSQL) unavailable: admin writes fail as
// unavailable (503), the provider keeps its last-known state and retries,
// extraction and snapshots carry on; the depletion recorded during the
// outage switches the routing once the store is back, exactly once.
func TestFaultManagementStoreDown(t *testing.T) {
	ps := startUpstreams(t, 4)
	va, vb := startVendor(t, ps[:2]), startVendor(t, ps[2:])
	cfg := parseConfig(t, upstreamYAML("vendor-a", va.URL())+upstreamYAML("vendor-b", vb.URL()), `
  - name: seq
    strategy: sequential
    upstreams: [vendor-a, vendor-b]`)
	sw := &downSwitch{}
	wd := startWorldWith(t, cfg, worldOptions{wrap: func(m management.Store) management.Store { sw.Store = m; return sw }})
	ctx := context.Background()
	within(t, "vendor-a's proxies published", func() bool {
		s := wd.w.Last()
		if s == nil {
			return false
		}
		n := 0
		for _, p := range s.Proxies {
			if p.Upstream == "vendor-a" {
				n++
			}
		}
		return n == 2
	})

	sw.down.Store(true)
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"disable", func() error { return wd.c.SetUpstreamEnabled(ctx, "ops", "vendor-b", false) }},
		{"switch", func() error { return wd.c.SwitchRouting(ctx, "ops", "seq", 1) }},
		{"audit", func() error { _, err := wd.c.Audit(ctx, 5); return err }},
		{"routings", func() error { _, err := wd.c.Routings(ctx); return err }},
	} {
		if err := tc.call(); !errors.Is(err, management.ErrUnavailable) {
			t.Fatalf("%s during the outage = %v, want management.ErrUnavailable", tc.name, err)
		}
	}
	us, err := wd.c.Upstreams(ctx)
	if err != nil || !us[1].Enabled {
		t.Fatalf("a failed disable took effect: %+v, %v", us, err)
	}
	// A reload does not need the store; its audit entry waits for it.
	if err := wd.c.Reload(ctx, cfg, ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}); err != nil {
		t.Fatalf("reload during the outage: %v", err)
	}
	wd.c.RecordReload("ops", nil)
	// vendor-a runs dry during the outage. Extraction is unaffected, and
	// takes vendor-a below its minimum: the runtime keeps fetching, the
	// switch cannot be recorded and stays pending; snapshots keep coming
	// with the last known cursor.
	va.SetMode(testenv.VendorEmpty)
	res, err := wd.c.Extract(ctx, extraction.Request{Client: "c", Count: 1, Filters: extraction.Filters{Upstreams: []string{"vendor-a"}}})
	if err != nil || res.Returned != 1 {
		t.Fatalf("extract during the outage = %+v, %v", res, err)
	}
	within(t, "the depletion pending", func() bool {
		d, _ := wd.c.FetchDetail("vendor-a")
		return d.DepletionPending
	})
	if got := wd.c.sup.Running(); len(got) != 2 {
		t.Fatalf("runtimes during the outage = %v, want both (last known overrides)", got)
	}
	calls := va.Calls()
	v0 := wd.w.Last().Version
	within(t, "fetching and publishing carry on", func() bool {
		s := wd.w.Last()
		return va.Calls() > calls && s.Version > v0+2 && s.Cursors["seq"] == 0
	})

	sw.down.Store(false)
	within(t, "the pending switch recorded", func() bool { s := wd.w.Last(); return s.Cursors["seq"] == 1 })
	rs, err := wd.c.Routings(ctx)
	if err != nil || rs[0].Generation != 1 || rs[0].Current != "vendor-b" {
		t.Fatalf("routing after recovery = %+v, %v (want one switch)", rs, err)
	}
	// The cursor is published before the runtime hears that its pending
	// depletion was recorded: wait for the flag rather than race it.
	within(t, "the pending depletion cleared", func() bool {
		d, _ := wd.c.FetchDetail("vendor-a")
		return !d.DepletionPending
	})
	if err := wd.c.SwitchRouting(ctx, "ops", "seq", 0); err != nil {
		t.Fatalf("admin write after recovery: %v", err)
	}
	// Every admin write of the outage is in the audit log, in order (the
	// store lists newest first), with its result.
	audit, err := wd.c.Audit(ctx, 20)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range audit {
		res := "ok"
		if e.Result != "ok" {
			res = "failed"
		}
		got = append(got, e.Action+":"+res)
	}
	want := "routing.switch:ok config.reload:ok routing.switch:failed upstream.disable:failed"
	if strings.Join(got, " ") != want {
		t.Fatalf("audit = %v, want %s", got, want)
	}
}

// Checker backlog at the controller: see health's TestCheckerBacklogFault
// (real scheduler, bounded queue, new and SUSPECT first). Here: a request
// never waits for a vendor, even while the only runtime is stuck in a call.
func TestExtractNeverWaitsForAProviderCall(t *testing.T) {
	ps := startUpstreams(t, 2)
	v := startVendor(t, ps)
	gate := &gatedAdapter{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	cfg := parseConfig(t, upstreamYAML("vendor-a", v.URL()), "")
	wd := startWorldWith(t, cfg, worldOptions{
		providers: ctltest.Providers{"vendor": gate},
		beforeRun: func(*world) { gate.armed.Store(true) }, // after New's pre-check
	})
	t.Cleanup(func() { gate.open() })
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the runtime never built a request")
	}
	// The runtime is blocked inside its call; the pool is empty.
	res, err := wd.c.Extract(context.Background(), extraction.Request{Client: "c", Count: 2})
	if err != nil || res.Returned != 0 || res.Requested != 2 {
		t.Fatalf("extract = %+v, %v; want an immediate empty partial answer", res, err)
	}
	_, err = wd.c.Extract(context.Background(), extraction.Request{Client: "c", Count: 1, Fulfillment: extraction.AllOrNothing})
	if !errors.Is(err, extraction.ErrInsufficient) {
		t.Fatalf("allOrNothing on an empty pool = %v", err)
	}
	if v.Calls() != 0 {
		t.Fatal("the vendor was called while the build was still blocked")
	}
	gate.open()
	within(t, "the refill once the call proceeds", func() bool { s := wd.w.Last(); return s != nil && len(s.Proxies) == 2 })
}

// gatedAdapter blocks BuildRequest, once armed, until released.
type gatedAdapter struct {
	ctltest.VendorAdapter
	armed   atomic.Bool
	release chan struct{}
	once    sync.Once
	entered chan struct{}
}

func (g *gatedAdapter) open() { g.once.Do(func() { close(g.release) }) }

func (g *gatedAdapter) BuildRequest(ctx context.Context, in upstream.BuildInput) (upstream.Request, error) {
	if g.armed.Load() {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		select {
		case <-g.release:
		case <-ctx.Done():
			return upstream.Request{}, ctx.Err()
		}
	}
	return g.VendorAdapter.BuildRequest(ctx, in)
}

func TestStatusReportsWorkerCapacity(t *testing.T) {
	v := startVendor(t, nil)
	v.SetMode(testenv.VendorEmpty)
	cfg := parseConfig(t, `
  - name: vendor-a
    provider: {plugin: vendor, params: {url: "`+v.URL()+`/v1/proxies"}}
    pool: {minimum: 1, target: 2}
    check: {interval: 1h}`, "")
	ctx := context.Background()
	var ids []proxy.ID
	wd := startWorldWith(t, cfg, worldOptions{beforeRun: func(wd *world) {
		var err error
		if ids, err = ctltest.AddAvailable(ctx, wd.pool, "vendor-a", 3, 100, time.Now(), time.Hour); err != nil { // maxConcurrency 4
			t.Fatal(err)
		}
	}})
	within(t, "all three owned by the gateway", func() bool { s := wd.w.Last(); return s != nil && len(s.Proxies) == 3 })
	wd.w.SetCounts(ids[0], 3, 1)
	wd.w.SetCounts(ids[1], 1, 0)
	us, err := wd.c.Upstreams(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if us[0].Available != 2 || us[0].AvailableSlots != 7 || us[0].Managed != 3 {
		t.Fatalf("upstream = %+v, want 2 available with 0+3+4 = 7 free slots", us[0])
	}
	st, err := wd.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Workers) != 1 || st.Workers[0].Active != 4 || st.Workers[0].Reserved != 1 || st.Workers[0].SnapshotVersion == 0 {
		t.Fatalf("workers = %+v", st.Workers)
	}
	if st.Version != "test" || st.ConfigLoadedAt.IsZero() || st.StartedAt.IsZero() || st.StorageMode != "embedded" || st.Snapshot.Version == 0 || st.Proxies["AVAILABLE"] != 3 {
		t.Fatalf("status = %+v", st)
	}
	if !strings.Contains(fmt.Sprint(us[0].States), "AVAILABLE:3") {
		t.Fatalf("states = %v", us[0].States)
	}
}
