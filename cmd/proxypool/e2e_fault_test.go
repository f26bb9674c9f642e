package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/testenv"
)

// The appliance's behaviour when a cluster store fails under it (seed 000
// §18), on the real binary against testenv's real redis-server and
// PostgreSQL. Each test bounds every wait with a deadline.

// faultWait bounds each wait of these tests; generous for a loaded 2-core
// machine, never reached when things work.
const faultWait = 20 * time.Second

// clusterStorage is the storage section for rds and pg.
func clusterStorage(rds *testenv.Redis, pg *testenv.Postgres) string {
	return fmt.Sprintf(`storage:
  mode: cluster
  redis: {url: "%s"}
  postgres: {url: "%s", migrateOnStart: true, fingerprintKey: "env:E2E_FP_KEY"}
`, rds.URL(), pg.URL())
}

// startCluster runs the appliance on a fresh Redis and PostgreSQL; extra
// is more top-level configuration.
func startCluster(t *testing.T, w *world, extra string) (*proc, *testenv.Redis, *testenv.Postgres) {
	t.Helper()
	rds := testenv.StartRedis(t)
	pg := testenv.StartPostgres(t)
	p := startWith(t, w, clusterStorage(rds, pg)+extra, []string{"E2E_FP_KEY=fingerprint-key"}, "../../plugins")
	return p, rds, pg
}

// call sends a request and returns the status and body.
func call(t *testing.T, method, u, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// extractAll asks for up to count proxies (partial) and returns the HTTP
// status, the body and the upstream proxy IDs handed out.
func extractAll(t *testing.T, p *proc, w *world, count int) (int, []byte, []string) {
	t.Helper()
	code, b := call(t, http.MethodPost, "http://"+p.dist+"/v1/extract", fmt.Sprintf(`{"count": %d, "fulfillment": "partial"}`, count))
	if code != http.StatusOK {
		return code, b, nil
	}
	var out struct {
		Proxies []struct {
			Host string
			Port int
		}
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("extract answer %s: %v", b, err)
	}
	ids := make([]string, 0, len(out.Proxies))
	for _, px := range out.Proxies {
		id := w.byAddr[fmt.Sprintf("%s:%d", px.Host, px.Port)]
		if id == "" {
			t.Fatalf("extracted an unknown proxy %s:%d", px.Host, px.Port)
		}
		ids = append(ids, id)
	}
	return code, b, ids
}

// wantUnavailable checks a 503 answer: an RFC 9457 problem whose detail
// contains want, showing no internals (no stack, no store address, no
// credential).
func wantUnavailable(t *testing.T, code int, b []byte, want string, secrets ...string) {
	t.Helper()
	var pr struct {
		Type, Title, Detail string
		Status              int
	}
	if err := json.Unmarshal(b, &pr); err != nil {
		t.Fatalf("not a JSON problem (%d): %s", code, b)
	}
	if code != http.StatusServiceUnavailable || pr.Status != code || pr.Type != "urn:proxypool:problem:unavailable" || !strings.Contains(pr.Detail, want) {
		t.Fatalf("answer %d %s: want 503 and a detail naming %q", code, b, want)
	}
	for _, s := range append(secrets, "goroutine", ".go:", "panic", "p@ss:word", "vendor-key", "fingerprint-key") {
		if s != "" && bytes.Contains(b, []byte(s)) {
			t.Fatalf("the problem leaks %q: %s", s, b)
		}
	}
}

// metric returns the value of one series (its exact name and labels as
// exposed, e.g. `x_total{result="error"}`), 0 when absent.
func metric(t *testing.T, p *proc, series string) float64 {
	t.Helper()
	code, b := call(t, http.MethodGet, "http://"+p.admin+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && name == series {
			f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return 0
}

// publishErrors counts failed snapshot publishes: the publisher runs every
// second and fails on each round while Redis is down, so it is the
// controller tick these tests wait on.
const publishErrors = `proxypool_distribution_publish_total{result="error"}`

// waitAdvance waits until series grew by n from its current value.
func waitAdvance(t *testing.T, p *proc, series string, n float64) {
	t.Helper()
	from := metric(t, p, series)
	eventually(t, faultWait, fmt.Sprintf("%s to grow by %v", series, n), func() bool {
		return metric(t, p, series) >= from+n
	})
}

// storeState is the storage part of GET /v1/admin/status.
type storeState struct {
	Reachable bool
	Error     string
}

type faultStatus struct {
	Proxies map[string]int
	Storage struct {
		ActivityPool      storeState
		Management        storeState
		GenerationChanges int64
	}
}

func status(t *testing.T, p *proc) faultStatus {
	t.Helper()
	var st faultStatus
	getJSON(t, "http://"+p.admin+"/v1/admin/status", &st)
	return st
}

// Redis restarted with its state lost: the gateway serves from its
// snapshot meanwhile, extraction answers a clear 503; once Redis is back
// the appliance moves to the new generation, refills the pool from the
// vendor, extracts again, and never hands out a proxy twice.
func TestFaultRedisRestartLosesState(t *testing.T) {
	// Five proxies for a pool target of five: after the restart the vendor
	// serves all five again, the two extracted before included.
	w := newWorld(t, 5)
	p, rds, _ := startCluster(t, w, "")
	seen := map[string]bool{}
	collect := func(ids []string) {
		t.Helper()
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("proxy %s extracted twice (all so far: %v)", id, seen)
			}
			seen[id] = true
		}
	}
	eventually(t, faultWait, "the pool full", func() bool { return status(t, p).Proxies["AVAILABLE"] == 5 })
	viaGateway(t, p, w.target.URL()+"/before")
	code, b, ids := extractAll(t, p, w, 2)
	if code != http.StatusOK || len(ids) != 2 {
		t.Fatalf("extract before the restart: %d %s", code, b)
	}
	collect(ids)

	rds.Stop()
	waitAdvance(t, p, publishErrors, 1)
	for i := range 5 {
		if r := viaGateway(t, p, w.target.URL()+"/during"); seen[r.UpstreamProxy] {
			t.Fatalf("request %d went through extracted proxy %s", i, r.UpstreamProxy)
		}
	}
	code, b, _ = extractAll(t, p, w, 1)
	wantUnavailable(t, code, b, "activity pool store is unavailable", rds.Addr())

	calls := w.vendor.Calls()
	rds.Start() // empty: testenv's Redis keeps nothing across a restart
	eventually(t, faultWait, "the new generation noticed", func() bool {
		return metric(t, p, "proxypool_store_generation_changes_total") >= 1
	})
	if !strings.Contains(p.logs.String(), "redis generation changed") {
		t.Fatal("the generation change was not logged")
	}
	// The pool is rebuilt from the vendor: the three never extracted are
	// admitted and checked again; the two extracted are still in their
	// client's hands until they expire and must not come back.
	eventually(t, faultWait, "the pool rebuilt", func() bool {
		st := status(t, p)
		return st.Proxies["AVAILABLE"] >= 3 && st.Proxies["FETCHED"]+st.Proxies["CHECKING"] == 0
	})
	if w.vendor.Calls() <= calls {
		t.Fatal("the vendor was not called again after the restart")
	}
	var ups struct {
		Upstreams []struct {
			Fetch struct{ Leader bool }
		}
	}
	getJSON(t, "http://"+p.admin+"/v1/admin/upstreams", &ups)
	if len(ups.Upstreams) != 1 || !ups.Upstreams[0].Fetch.Leader {
		t.Fatalf("upstreams after the restart: %+v, want the fetch leader re-elected", ups)
	}
	if st := status(t, p); !st.Storage.ActivityPool.Reachable || st.Storage.GenerationChanges < 1 {
		t.Fatalf("status after the restart: %+v", st.Storage)
	}
	viaGateway(t, p, w.target.URL()+"/after")
	code, b, ids = extractAll(t, p, w, 5)
	if code != http.StatusOK || len(ids) == 0 {
		t.Fatalf("extract after the restart: %d %s", code, b)
	}
	collect(ids)
}

// Redis unreachable for a while: the gateway keeps serving from its
// snapshot and stays ready, fetching stops, the admin status says why;
// past gateway.maxStaleAge the gateway refuses as stale and leaves the
// load balancer.
func TestFaultRedisUnreachable(t *testing.T) {
	// Three proxies for a pool minimum of five: the provider runtime keeps
	// calling the vendor while it can record what it got.
	w := newWorld(t, 3)
	p, rds, _ := startCluster(t, w, "gateway: {maxStaleAge: 15s}\n")
	before := w.vendor.Calls()
	eventually(t, faultWait, "the vendor called steadily", func() bool { return w.vendor.Calls() >= before+3 })

	rds.Stop()
	waitAdvance(t, p, publishErrors, 1)
	if code, _ := call(t, http.MethodGet, "http://"+p.admin+"/readyz", ""); code != http.StatusOK {
		t.Fatalf("/readyz with Redis down: %d", code)
	}
	for range 5 {
		viaGateway(t, p, w.target.URL()+"/redis-down")
	}

	// After a second failed round whatever call was in flight when Redis
	// went has finished; three more controller ticks call no vendor.
	waitAdvance(t, p, publishErrors, 1)
	calls := w.vendor.Calls()
	waitAdvance(t, p, publishErrors, 3)
	if got := w.vendor.Calls(); got != calls {
		t.Fatalf("the vendor was called %d times with Redis down", got-calls)
	}

	st := status(t, p)
	if st.Storage.ActivityPool.Reachable || st.Storage.ActivityPool.Error == "" || !st.Storage.Management.Reachable {
		t.Fatalf("status with Redis down: %+v", st.Storage)
	}
	if metric(t, p, `proxypool_store_up{store="activitypool"}`) != 0 || metric(t, p, `proxypool_store_up{store="management"}`) != 1 {
		t.Fatal("proxypool_store_up does not show Redis down and PostgreSQL up")
	}
	code, b := call(t, http.MethodGet, "http://"+p.admin+"/v1/admin/upstreams", "")
	wantUnavailable(t, code, b, "activity pool", rds.Addr())

	// Past maxStaleAge without a snapshot: stale, not ready.
	eventually(t, 2*faultWait, "/readyz turning 503", func() bool {
		code, _ := call(t, http.MethodGet, "http://"+p.admin+"/readyz", "")
		return code == http.StatusServiceUnavailable
	})
	if code, reason := gatewayStatus(t, p, w.target.URL()+"/stale"); code != http.StatusServiceUnavailable || reason != "stale" {
		t.Fatalf("gateway past maxStaleAge: %d %q, want 503 stale", code, reason)
	}
}

// gatewayStatus sends one GET through the gateway and returns the status
// and the gateway's reason header.
func gatewayStatus(t *testing.T, p *proc, target string) (int, string) {
	t.Helper()
	proxyURL, _ := url.Parse("http://" + p.gateway)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 10 * time.Second}
	resp, err := c.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Proxypool-Reason")
}

// PostgreSQL down: admin writes and the reads that need it fail with a
// clear 503; extraction, the gateway and fetching go on; once PostgreSQL
// is back the same write succeeds on a reconnected pool.
func TestFaultPostgresDown(t *testing.T) {
	w := newWorld(t, 3)
	p, _, pg := startCluster(t, w, "")
	pg.Stop()

	pgURL, err := url.Parse(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	disable := "http://" + p.admin + "/v1/admin/upstreams/vendor/disable"
	code, b := call(t, http.MethodPost, disable, "")
	wantUnavailable(t, code, b, "management store is unavailable", pgURL.Host)
	code, b = call(t, http.MethodGet, "http://"+p.admin+"/v1/admin/audit?limit=5", "")
	wantUnavailable(t, code, b, "management store is unavailable", pgURL.Host)

	st := status(t, p)
	if st.Storage.Management.Reachable || st.Storage.Management.Error == "" || !st.Storage.ActivityPool.Reachable {
		t.Fatalf("status with PostgreSQL down: %+v", st.Storage)
	}
	if code, _ := call(t, http.MethodGet, "http://"+p.admin+"/readyz", ""); code != http.StatusOK {
		t.Fatalf("/readyz with PostgreSQL down: %d", code)
	}

	// Extraction and the gateway do not need PostgreSQL; the provider
	// runtime keeps its last-known state (enabled) and keeps fetching.
	code, b, ids := extractAll(t, p, w, 1)
	if code != http.StatusOK || len(ids) != 1 {
		t.Fatalf("extract with PostgreSQL down: %d %s", code, b)
	}
	for range 5 {
		viaGateway(t, p, w.target.URL()+"/pg-down")
	}
	calls := w.vendor.Calls()
	eventually(t, faultWait, "the vendor still called", func() bool { return w.vendor.Calls() > calls })
	var ups struct {
		Upstreams []struct {
			Name    string
			Enabled bool
		}
	}
	getJSON(t, "http://"+p.admin+"/v1/admin/upstreams", &ups)
	if len(ups.Upstreams) != 1 || !ups.Upstreams[0].Enabled {
		t.Fatalf("upstreams with PostgreSQL down: %+v", ups)
	}

	pg.Start()
	eventually(t, faultWait, "the admin write succeeding again", func() bool {
		code, _ := call(t, http.MethodPost, disable, "")
		return code == http.StatusOK
	})
	var audit struct {
		Entries []struct{ Action, Target, Result string }
	}
	getJSON(t, "http://"+p.admin+"/v1/admin/audit?limit=50", &audit)
	var failed, ok bool
	for _, e := range audit.Entries {
		if e.Action == "upstream.disable" && e.Target == "vendor" {
			failed = failed || e.Result != "ok"
			ok = ok || e.Result == "ok"
		}
	}
	if !failed || !ok {
		t.Fatalf("the audit log lacks the failed attempt or the success: %+v", audit.Entries)
	}
	if st := status(t, p); !st.Storage.Management.Reachable {
		t.Fatalf("status after PostgreSQL restarted: %+v", st.Storage)
	}
}
