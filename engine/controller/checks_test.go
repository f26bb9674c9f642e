package controller

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/testenv"
)

// startSite is a target site that refuses (403) requests arriving from one
// source address, as a site that banned one exit IP does.
func startSite(t *testing.T, banned string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if host, _, _ := net.SplitHostPort(r.RemoteAddr); host == banned {
			http.Error(w, "banned", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func byPort(s *worker.Snapshot, port int) (proxy.Proxy, bool) {
	for _, p := range s.Proxies {
		if int(p.Key.Port) == port {
			return p, true
		}
	}
	return proxy.Proxy{}, false
}

func TestControllerEgressAndTargetChecks(t *testing.T) {
	ups, err := testenv.StartUpstreams(3, "pu", "pp-secret")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range ups {
		t.Cleanup(func() { _ = u.Close() })
	}
	if ups[0].DialSource() == "" {
		t.Skip("upstreams cannot dial from distinct loopback addresses here")
	}
	// A proxy that exits from our own address: transparent.
	direct, err := testenv.NewUpstreamProxy(testenv.UpstreamConfig{Username: "pu", Password: "pp-secret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	echo, err := testenv.NewTarget("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = echo.Close() })
	site := startSite(t, ups[1].DialSource())
	var vps []testenv.VendorProxy
	for _, u := range append(slices.Clone(ups), direct) {
		vps = append(vps, testenv.VendorProxy{Host: u.Host(), Port: u.Port(), Username: "pu", Password: "pp-secret"})
	}
	v := startVendor(t, vps)
	cfg := parseConfig(t, fmt.Sprintf(`
  - name: vendor-a
    provider: {plugin: vendor, params: {url: "%s/v1/proxies"}}
    fetch: {requestInterval: 10ms, estimatedIPsPerCall: 4}
    pool: {minimum: 3, target: 4, maxSize: 10}
    check: {interval: 1s, timeout: 2s, failureThreshold: 2, egressURL: "%s/ip"}`, v.URL(), echo.URL()), fmt.Sprintf(`
  - name: shop
    match: {hosts: [shop.example]}
    upstreams: [vendor-a]
    check: {url: "%s/", interval: 1s}
  - name: news
    upstreams: [vendor-a]`, site))
	wd := startWorld(t, cfg, nil)

	var banned proxy.Proxy
	within(t, "the three anonymous proxies published and the banned one excluded from shop only", func() bool {
		s := wd.w.Last()
		if s == nil || len(s.Proxies) != 3 {
			return false
		}
		var ok bool
		if banned, ok = byPort(s, ups[1].Port()); !ok {
			return false
		}
		ex := s.RoutingExclusions
		return len(ex["shop"]) == 1 && ex["shop"][0] == banned.ID && len(ex["news"]) == 0
	})
	s := wd.w.Last()
	if _, ok := byPort(s, direct.Port()); ok {
		t.Fatal("a proxy exiting from our own address was published")
	}
	within(t, "the transparent proxy declared unhealthy", func() bool {
		return wd.metric(t, "proxypool_health_transitions_total", map[string]string{"from": "CHECKING", "to": "UNHEALTHY"}) >= 1
	})
	if _, ok := byPort(wd.w.Last(), direct.Port()); ok {
		t.Fatal("a proxy exiting from our own address was published")
	}
	// The banned proxy keeps its state: the failure concerns shop only.
	if p, err := wd.pool.Get(context.Background(), banned.ID); err != nil || p.State != proxy.StateAvailable {
		t.Fatalf("banned proxy = %+v, %v; want AVAILABLE", p, err)
	}
	good, _ := byPort(s, ups[0].Port())
	h := wd.c.ProxyHealth(good.ID)
	if h.ExitIP != ups[0].DialSource() || h.Anonymity != "elite" || len(h.ExcludedRoutings) != 0 {
		t.Fatalf("health of a good proxy = %+v", h)
	}
	if h := wd.c.ProxyHealth(banned.ID); len(h.ExcludedRoutings) != 1 || h.ExcludedRoutings[0] != "shop" {
		t.Fatalf("health of the banned proxy = %+v", h)
	}
	if ex := wd.c.RoutingExclusions(); len(ex["shop"]) != 1 || len(ex) != 1 {
		t.Fatalf("routing exclusions = %v", ex)
	}
}

func TestReloadAppliesCheckerInFlightLimit(t *testing.T) {
	mgmt, err := embedded.OpenManagement(t.TempDir(), embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.Close() })
	cfg := parseConfig(t, upstreamYAML("vendor-a", "http://127.0.0.1:1"), "")
	c, err := New(Options{Config: cfg, Pool: embedded.NewPool(embedded.PoolOptions{}), Management: mgmt, Providers: ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Checker().MaxInFlight; got != 64 {
		t.Fatalf("initial check in-flight limit %d, want the default 64", got)
	}
	next := parseConfig(t, upstreamYAML("vendor-a", "http://127.0.0.1:1"), "")
	next.Upstreams[0].Check.MaxInFlight = 7
	if err := c.Reload(context.Background(), next, ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}); err != nil {
		t.Fatal(err)
	}
	if got := c.Checker().MaxInFlight; got != 7 {
		t.Fatalf("check in-flight limit after reload %d, want 7", got)
	}
}
