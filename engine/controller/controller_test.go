package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// world is a running controller against real loopback vendors and upstream
// proxies, on the embedded stores, with an in-memory gateway worker.
type world struct {
	c       *Controller
	pool    *embedded.Pool
	mgmt    *embedded.Management
	w       *ctltest.Worker
	vendors map[string]*testenv.Vendor
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan struct{}
}

func startUpstreams(t *testing.T, n int) []testenv.VendorProxy {
	t.Helper()
	ups, err := testenv.StartUpstreams(n, "pu", "pp-secret")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]testenv.VendorProxy, 0, n)
	for _, u := range ups {
		t.Cleanup(func() { _ = u.Close() })
		out = append(out, testenv.VendorProxy{Host: u.Host(), Port: u.Port(), Username: "pu", Password: "pp-secret", Region: "eu"})
	}
	return out
}

func startVendor(t *testing.T, ps []testenv.VendorProxy) *testenv.Vendor {
	t.Helper()
	v, err := testenv.NewVendor(testenv.VendorConfig{Proxies: ps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	return v
}

func upstreamYAML(name, url string) string {
	return fmt.Sprintf(`
  - name: %s
    provider: {plugin: vendor, params: {url: "%s/v1/proxies"}}
    fetch: {requestInterval: 10ms, emptyThreshold: 2, estimatedIPsPerCall: 5, backoff: {initial: 10ms, max: 50ms}}
    pool: {minimum: 2, target: 3, maxSize: 10}
    check: {interval: 1s, timeout: 2s, failureThreshold: 2}`, name, url)
}

func parseConfig(t *testing.T, upstreams, routings string) *config.Config {
	t.Helper()
	y := "listeners: {gateway: 127.0.0.1:18080}\nsecurity: {allowLoopbackDestinations: true}\nupstreams:" + upstreams + "\n"
	if routings != "" {
		y += "routings:" + routings + "\n"
	}
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startWorld(t *testing.T, cfg *config.Config, vendors map[string]*testenv.Vendor) *world {
	t.Helper()
	return startWorldWith(t, cfg, worldOptions{vendors: vendors})
}

// worldOptions varies a world: wrap replaces the management store with a
// wrapper of the embedded one, providers replaces the vendor adapter, and
// beforeRun runs after New and before Run (seed the pool, arm a gate).
type worldOptions struct {
	vendors   map[string]*testenv.Vendor
	wrap      func(management.Store) management.Store
	providers ctltest.Providers
	beforeRun func(wd *world)
}

func startWorldWith(t *testing.T, cfg *config.Config, o worldOptions) *world {
	t.Helper()
	mgmt, err := embedded.OpenManagement(t.TempDir(), embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.Close() })
	var store management.Store = mgmt
	if o.wrap != nil {
		store = o.wrap(mgmt)
	}
	if o.providers == nil {
		o.providers = ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}
	}
	wd := &world{pool: embedded.NewPool(embedded.PoolOptions{}), mgmt: mgmt, w: ctltest.NewWorker(), vendors: o.vendors, reg: prometheus.NewRegistry(), done: make(chan struct{})}
	c, err := New(Options{
		Config: cfg, Pool: wd.pool, Management: store, Providers: o.providers,
		Worker: wd.w, Registry: wd.reg, Version: "test",
		Timing: Timing{Publish: 50 * time.Millisecond, Lifecycle: 50 * time.Millisecond, HealthSweep: 50 * time.Millisecond, ProviderTick: 20 * time.Millisecond, Reconcile: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	wd.c = c
	if o.beforeRun != nil {
		o.beforeRun(wd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wd.cancel = cancel
	go func() { _ = c.Run(ctx); close(wd.done) }()
	t.Cleanup(wd.stop)
	return wd
}

// metric reads one counter or gauge series from the world's registry.
func (wd *world) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := wd.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func (wd *world) stop() {
	wd.cancel()
	<-wd.done
}

func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !ctltest.Eventually(10*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestControllerLoopVendorToSnapshot(t *testing.T) {
	ps := startUpstreams(t, 4)
	v := startVendor(t, ps)
	cfg := parseConfig(t, upstreamYAML("vendor-a", v.URL()), "")
	wd := startWorld(t, cfg, nil)
	ctx := context.Background()

	// The loop is already running and may publish at once: ready must
	// never be seen before the worker holds a snapshot with proxies (read
	// in this order, a later snapshot cannot excuse an early ready).
	if ready, s := wd.c.Ready(), wd.w.Last(); ready && (s == nil || len(s.Proxies) == 0) {
		t.Fatal("ready before any proxy was published")
	}
	// vendor -> FETCHED -> CHECKING -> AVAILABLE -> published snapshot.
	within(t, "a snapshot with 3 proxies", func() bool {
		s := wd.w.Last()
		return s != nil && len(s.Proxies) == 3
	})
	if !wd.c.Ready() {
		t.Fatal("not ready after a snapshot with proxies")
	}
	s := wd.w.Last()
	for _, p := range s.Proxies {
		if p.State != proxy.StateAvailable || p.Owner != DefaultWorkerID || p.Password != "pp-secret" || p.LastSuccessAt.IsZero() {
			t.Fatalf("published proxy = %+v", p)
		}
	}
	st, err := wd.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Proxies["AVAILABLE"] != 3 || !st.Ready || st.Snapshot.Proxies != 3 || len(st.Workers) != 1 || st.Workers[0].SnapshotVersion == 0 {
		t.Fatalf("status = %+v", st)
	}
	ups, err := wd.c.Upstreams(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ups) != 1 || !ups[0].Enabled || ups[0].Available != 3 || ups[0].Fetch.Success == 0 || ups[0].Fetch.TotalFetched != 3 {
		t.Fatalf("upstreams = %+v", ups)
	}
	views, err := wd.c.Proxies(ctx, activitypool.Filter{States: []proxy.State{proxy.StateAvailable}})
	if err != nil || len(views) != 3 {
		t.Fatalf("proxies = %v, %v", views, err)
	}
	if !views[0].HasAuth || strings.Contains(fmt.Sprintf("%+v", views), "pp-secret") {
		t.Fatal("proxy view missing auth flag or leaking the password")
	}

	// Extraction revokes from the gateway; the extracted proxy never comes
	// back to it. (2 left is the pool minimum: no refill by hysteresis.)
	res, err := wd.c.Extract(ctx, extraction.Request{Client: "c1", Count: 1, Fulfillment: extraction.AllOrNothing})
	if err != nil {
		t.Fatal(err)
	}
	got := res.Proxies[0]
	if got.Password != "pp-secret" || got.State != proxy.StateExtracted {
		t.Fatalf("extracted = %+v", got)
	}
	within(t, "the extracted proxy withdrawn", func() bool {
		return len(wd.w.Last().Proxies) == 2 && !wd.w.Has(got.ID)
	})
	for range 3 {
		v0 := wd.w.Last().Version
		within(t, "another publish", func() bool { return wd.w.Last().Version > v0 })
		if wd.w.Has(got.ID) {
			t.Fatal("an extracted proxy was handed to the gateway")
		}
	}
	if st, _ := wd.c.Status(ctx); st.Extraction.Requests != 1 || st.Extraction.Returned != 1 {
		t.Fatalf("extraction counters = %+v", st.Extraction)
	}
}

func TestControllerUnhealthyProxiesNeverPublished(t *testing.T) {
	ps := startUpstreams(t, 2)
	ps[1].Password = "wrong" // the vendor hands out a credential the proxy refuses (407)
	v := startVendor(t, ps)
	cfg := parseConfig(t, upstreamYAML("vendor-a", v.URL()), "")
	wd := startWorld(t, cfg, nil)
	within(t, "the good proxy published", func() bool { s := wd.w.Last(); return s != nil && len(s.Proxies) == 1 })
	within(t, "the bad proxy declared unhealthy", func() bool {
		return wd.metric(t, "proxypool_health_transitions_total", map[string]string{"from": "CHECKING", "to": "UNHEALTHY"}) >= 1
	})
	for _, p := range wd.w.Last().Proxies {
		if p.Password == "wrong" {
			t.Fatal("a proxy failing its check was published")
		}
	}
}

func TestControllerSequentialFailoverAndAdmin(t *testing.T) {
	ps := startUpstreams(t, 4)
	va := startVendor(t, ps[:2])
	vb := startVendor(t, ps[2:])
	va.SetMode(testenv.VendorEmpty)
	cfg := parseConfig(t, upstreamYAML("vendor-a", va.URL())+upstreamYAML("vendor-b", vb.URL()), `
  - name: seq
    strategy: sequential
    upstreams: [vendor-a, vendor-b]`)
	wd := startWorld(t, cfg, nil)
	ctx := context.Background()

	within(t, "the routing to switch to vendor-b", func() bool {
		s := wd.w.Last()
		return s != nil && s.Cursors["seq"] == 1
	})
	rs, err := wd.c.Routings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Current != "vendor-b" || rs[0].Generation != 1 {
		t.Fatalf("routings = %+v", rs)
	}
	// More empties do not move it again (stop policy would exhaust it).
	within(t, "more empty fetches", func() bool {
		us, _ := wd.c.Upstreams(ctx)
		return us[0].Fetch.Empty >= 4
	})
	if rs, _ := wd.c.Routings(ctx); rs[0].Generation != 1 {
		t.Fatalf("a second run of empties switched again: %+v", rs[0])
	}

	// Admin operations, audited.
	if err := wd.c.SwitchRouting(ctx, "ops", "seq", 0); err != nil {
		t.Fatal(err)
	}
	within(t, "the manual switch published", func() bool { return wd.w.Last().Cursors["seq"] == 0 })
	if err := wd.c.SwitchRouting(ctx, "ops", "seq", 5); !errors.Is(err, ErrInvalidSwitch) {
		t.Fatalf("err = %v, want ErrInvalidSwitch", err)
	}
	if err := wd.c.SwitchRouting(ctx, "ops", "nope", 0); !errors.Is(err, ErrUnknownRouting) {
		t.Fatalf("err = %v, want ErrUnknownRouting", err)
	}
	if err := wd.c.SetUpstreamEnabled(ctx, "ops", "nope", false); !errors.Is(err, ErrUnknownUpstream) {
		t.Fatalf("err = %v, want ErrUnknownUpstream", err)
	}
	within(t, "vendor-b proxies published", func() bool { return len(wd.w.Last().Proxies) > 0 })
	if err := wd.c.SetUpstreamEnabled(ctx, "ops", "vendor-b", false); err != nil {
		t.Fatal(err)
	}
	within(t, "vendor-b disabled in the snapshot and drained", func() bool {
		s := wd.w.Last()
		return s.Disabled["vendor-b"] && len(s.Proxies) == 0
	})
	if on, set, _ := wd.mgmt.UpstreamEnabled(ctx, "vendor-b"); on || !set {
		t.Fatal("the override was not persisted")
	}
	us, _ := wd.c.Upstreams(ctx)
	if us[1].Enabled || us[1].Fetch.Stopped != "disabled" {
		t.Fatalf("vendor-b status = %+v", us[1])
	}
	// Every admin write is audited, refused ones included, with who, when,
	// what and the result; newest first.
	audit, err := wd.c.Audit(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range audit {
		if e.Actor != "ops" || e.At.IsZero() {
			t.Errorf("audit entry without actor or time: %+v", e)
		}
		result := "ok"
		if e.Result != "ok" {
			result = "refused"
		}
		got = append(got, e.Action+" "+e.Target+" "+result)
	}
	want := []string{
		"upstream.disable vendor-b ok",
		"upstream.disable nope refused",
		"routing.switch nope[0] refused",
		"routing.switch seq[5] refused",
		"routing.switch seq[0] ok",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("audit =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestControllerReload(t *testing.T) {
	ps := startUpstreams(t, 4)
	va := startVendor(t, ps[:2])
	vb := startVendor(t, ps[2:])
	cfg := parseConfig(t, upstreamYAML("vendor-a", va.URL())+upstreamYAML("vendor-b", vb.URL()), "")
	wd := startWorld(t, cfg, nil)
	ctx := context.Background()
	within(t, "proxies of both upstreams", func() bool { s := wd.w.Last(); return s != nil && len(s.Proxies) == 4 })

	// A reload whose plugin cannot be resolved keeps everything.
	bad := parseConfig(t, upstreamYAML("vendor-a", va.URL()), "")
	bad.Upstreams[0].Provider.Plugin = "missing"
	err := wd.c.Reload(ctx, bad, ctltest.Providers{"vendor": &ctltest.VendorAdapter{}})
	if err == nil {
		t.Fatal("reload with a missing plugin succeeded")
	}
	wd.c.RecordReload("ops", err)
	if len(wd.c.Config().Upstreams) != 2 {
		t.Fatal("a failed reload replaced the configuration")
	}
	st, _ := wd.c.Status(ctx)
	if st.LastReload == nil || st.LastReload.OK || len(st.LastReload.Errors) == 0 {
		t.Fatalf("last reload = %+v", st.LastReload)
	}

	// Removing vendor-b: its proxies drain and leave the snapshot.
	next := parseConfig(t, upstreamYAML("vendor-a", va.URL()), "")
	if err := wd.c.Reload(ctx, next, ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}); err != nil {
		t.Fatal(err)
	}
	wd.c.RecordReload("ops", nil)
	within(t, "vendor-b proxies gone", func() bool {
		s := wd.w.Last()
		for _, p := range s.Proxies {
			if p.Upstream == "vendor-b" {
				return false
			}
		}
		ps, _ := wd.pool.List(ctx, activitypool.Filter{Upstream: "vendor-b"})
		return len(ps) == 0
	})
	if st, _ := wd.c.Status(ctx); st.LastReload == nil || !st.LastReload.OK || st.Upstreams != 1 {
		t.Fatalf("status after reload = %+v", st)
	}
	audit, _ := wd.c.Audit(ctx, 10)
	n := 0
	for _, e := range audit {
		if e.Action == "config.reload" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d reload audit entries, want 2", n)
	}
}

// downStore is a management store whose every call fails.
type downStore struct{ management.Store }

func (downStore) ListAudit(context.Context, int) ([]management.AuditEntry, error) {
	return nil, errors.New("disk gone")
}

func TestManagementOutageIsUnavailable(t *testing.T) {
	cfg := parseConfig(t, upstreamYAML("vendor-a", "http://127.0.0.1:1"), "")
	c, err := New(Options{Config: cfg, Pool: embedded.NewPool(embedded.PoolOptions{}), Management: downStore{},
		Providers: ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Audit(context.Background(), 5); !errors.Is(err, management.ErrUnavailable) {
		t.Fatalf("err = %v, want management.ErrUnavailable", err)
	}
}

func TestNewRequiresDependencies(t *testing.T) {
	cfg := parseConfig(t, upstreamYAML("vendor-a", "http://127.0.0.1:1"), "")
	if _, err := New(Options{Config: cfg}); err == nil {
		t.Fatal("New without stores succeeded")
	}
	mgmt, err := embedded.OpenManagement(t.TempDir(), embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgmt.Close()
	_, err = New(Options{Config: cfg, Pool: embedded.NewPool(embedded.PoolOptions{}), Management: mgmt, Providers: ctltest.Providers{}})
	if err == nil || !strings.Contains(err.Error(), "vendor") {
		t.Fatalf("New with an unknown plugin = %v", err)
	}
	empty, err := config.Parse([]byte("listeners: {gateway: 127.0.0.1:18080}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Config: empty, Pool: embedded.NewPool(embedded.PoolOptions{}), Management: mgmt, Providers: ctltest.Providers{}})
	if err != nil || !c.Ready() {
		t.Fatalf("no upstreams: ready immediately (%v)", err)
	}
}
