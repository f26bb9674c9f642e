package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/proxypool/proxypool/testenv"
)

// binary is the proxypool executable built once for the end-to-end tests:
// they drive a real process, with real signals.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "proxypool-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "proxypool")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building proxypool:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// world is the loopback environment: a vendor handing out N upstream
// proxies (with credentials), and a target that reports what reached it.
type world struct {
	vendor    *testenv.Vendor
	upstreams []*testenv.UpstreamProxy
	target    *testenv.Target
	byAddr    map[string]string // upstream proxy host:port -> id
}

func newWorld(t *testing.T, n int) *world { return newWorldPass(t, n, "p@ss:word") }

func newWorldPass(t *testing.T, n int, pass string) *world {
	t.Helper()
	ups, err := testenv.StartUpstreams(n, "u", pass)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{upstreams: ups, byAddr: map[string]string{}}
	t.Cleanup(func() {
		for _, u := range ups {
			u.Close()
		}
	})
	vp := make([]testenv.VendorProxy, 0, n)
	for _, u := range ups {
		vp = append(vp, testenv.VendorProxy{Host: u.Host(), Port: u.Port(), Username: "u", Password: pass, Region: "eu", Carrier: "lo"})
		w.byAddr[u.Addr()] = u.ID()
	}
	if w.vendor, err = testenv.NewVendor(testenv.VendorConfig{Proxies: vp, APIKey: "vendor-key"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.vendor.Close() })
	if w.target, err = testenv.NewTarget(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.target.Close() })
	w.target.Learn(ups)
	return w
}

// appliance is a running proxypool process.
type proc struct {
	cmd      *exec.Cmd
	cfgPath  string
	gateway  string
	dist     string
	admin    string
	logs     *syncBuffer
	exited   chan struct{}
	exitCode int
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

func (w *world) config(gw, dist, admin, stateDir, storage, pluginsDir string) string {
	return fmt.Sprintf(`%slisteners:
  gateway: %s
  distribution: %s
  admin: %s
stateDir: %s
pluginsDir: %s
log: {level: debug}
shutdownTimeout: 5s
upstreams:
  - name: vendor
    provider:
      plugin: json-envelope
      params: {url: "%s/v1/proxies"}
      secrets: {apiKey: "env:E2E_VENDOR_KEY"}
    fetch: {requestInterval: 100ms, estimatedIPsPerCall: 10}
    pool: {minimum: 5, target: 5, maxSize: 10, maxConcurrency: 64}
    check: {interval: 5s, timeout: 2s}
extraction:
  minRemainingTTL: 10s
security:
  allowLoopbackDestinations: true
`, storage, gw, dist, admin, stateDir, pluginsDir, w.vendor.URL())
}

func start(t *testing.T, w *world) *proc { return startWith(t, w, "", nil, "../../plugins") }

func startWith(t *testing.T, w *world, storage string, env []string, pluginsDir string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{cfgPath: filepath.Join(dir, "proxypool.yaml"), gateway: freeAddr(t), dist: freeAddr(t), admin: freeAddr(t), logs: &syncBuffer{}, exited: make(chan struct{})}
	if err := os.WriteFile(p.cfgPath, []byte(w.config(p.gateway, p.dist, p.admin, filepath.Join(dir, "state"), storage, pluginsDir)), 0o600); err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(binary, "run", "--config", p.cfgPath)
	p.cmd.Env = append(append(os.Environ(), "E2E_VENDOR_KEY=vendor-key", "NOTIFY_SOCKET="), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.exitCode = p.cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("proxypool output:\n%s", p.logs.String())
		}
	})
	eventually(t, 30*time.Second, "readyz", func() bool {
		resp, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

type received struct {
	Method        string            `json:"method"`
	Path          string            `json:"path"`
	Headers       map[string]string `json:"headers"`
	BodyBytes     int64             `json:"bodyBytes"`
	UpstreamProxy string            `json:"upstreamProxy"`
}

func viaGateway(t *testing.T, p *proc, target string) received {
	t.Helper()
	proxyURL, _ := url.Parse("http://" + p.gateway)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 10 * time.Second}
	resp, err := c.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s via gateway: %d %s (%s)", target, resp.StatusCode, b, resp.Header.Get("X-Proxypool-Reason"))
	}
	var r received
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestEndToEnd(t *testing.T) {
	w := newWorld(t, 5)
	p := start(t, w)
	ids := map[string]bool{}
	for _, u := range w.upstreams {
		ids[u.ID()] = true
	}

	t.Run("GET reaches the target through an upstream proxy", func(t *testing.T) {
		r := viaGateway(t, p, w.target.URL()+"/hello?x=1")
		if r.Path != "/hello" || !ids[r.UpstreamProxy] {
			t.Fatalf("target saw %+v", r)
		}
		for h := range r.Headers {
			if strings.EqualFold(h, "Proxy-Authorization") || strings.EqualFold(h, "Proxy-Connection") {
				t.Fatalf("%s reached the target", h)
			}
		}
	})

	t.Run("CONNECT tunnel carries bytes both ways", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", p.gateway, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		host := strings.TrimPrefix(w.target.URL(), "http://")
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		payload := strings.Repeat("ping-", 20000) // 100 KB up, echoed back down
		fmt.Fprintf(conn, "POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", host, len(payload), payload)
		echo, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(echo.Body)
		if string(body) != payload {
			t.Fatalf("echo returned %d bytes, want %d", len(body), len(payload))
		}
		// A second request on the same tunnel: the tunnel stays up.
		fmt.Fprintf(conn, "GET /again HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		again, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		var r received
		if err := json.NewDecoder(again.Body).Decode(&r); err != nil || r.Path != "/again" || !ids[r.UpstreamProxy] {
			t.Fatalf("second request in the tunnel: %+v %v", r, err)
		}
	})

	t.Run("extracted proxies are never used by the gateway again", func(t *testing.T) {
		resp, err := http.Post("http://"+p.dist+"/v1/extract", "application/json", strings.NewReader(`{"count": 2, "fulfillment": "allOrNothing"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Requested, Returned int
			Proxies             []struct {
				URL, Host, Password string
				Port                int
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("extract: %d %v", resp.StatusCode, err)
		}
		if out.Returned != 2 || len(out.Proxies) != 2 {
			t.Fatalf("extract returned %+v", out)
		}
		extracted := map[string]bool{}
		for _, px := range out.Proxies {
			id := w.byAddr[fmt.Sprintf("%s:%d", px.Host, px.Port)]
			if id == "" || px.Password != "p@ss:word" {
				t.Fatalf("extracted an unknown proxy or without credentials: %+v", px)
			}
			extracted[id] = true
		}
		if len(extracted) != 2 {
			t.Fatal("extract returned the same proxy twice")
		}
		for i := 0; i < 40; i++ {
			r := viaGateway(t, p, w.target.URL()+"/after-extract")
			if extracted[r.UpstreamProxy] {
				t.Fatalf("request %d went through extracted proxy %s", i, r.UpstreamProxy)
			}
		}
	})

	t.Run("admin status and upstreams", func(t *testing.T) {
		var st struct {
			Ready   bool
			Proxies map[string]int
		}
		getJSON(t, "http://"+p.admin+"/v1/admin/status", &st)
		if !st.Ready || st.Proxies["EXTRACTED"] != 2 || st.Proxies["AVAILABLE"] < 1 {
			t.Fatalf("status %+v", st)
		}
		var body struct {
			Upstreams []struct {
				Name    string
				Enabled bool
			}
		}
		getJSON(t, "http://"+p.admin+"/v1/admin/upstreams", &body)
		ups := body.Upstreams
		if len(ups) != 1 || ups[0].Name != "vendor" || !ups[0].Enabled {
			t.Fatalf("upstreams %+v", ups)
		}
		resp, err := http.Get("http://" + p.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, m := range []string{"proxypool_gateway_requests_total", "proxypool_provider_fetch_total", "proxypool_extraction_returned_total"} {
			if !bytes.Contains(b, []byte(m)) {
				t.Errorf("metric %s missing", m)
			}
		}
	})

	t.Run("a reload with a broken file keeps serving", func(t *testing.T) {
		good, err := os.ReadFile(p.cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		broken := strings.Replace(string(good), "maxSize: 10", "maxSize: 10, maxSzie: 3", 1) + "routings: [{name: r, upstreams: [ghost]}]\n"
		if err := os.WriteFile(p.cfgPath, []byte(broken), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the failed reload in the log", func() bool {
			return strings.Contains(p.logs.String(), "reload failed")
		})
		if !strings.Contains(p.logs.String(), "maxSzie") {
			t.Fatalf("the reload error does not name the bad field:\n%s", p.logs.String())
		}
		r := viaGateway(t, p, w.target.URL()+"/after-bad-reload")
		if !ids[r.UpstreamProxy] {
			t.Fatalf("not served after a failed reload: %+v", r)
		}
		// The admin API reports the same failure with every error.
		resp, err := http.Post("http://"+p.admin+"/v1/admin/reload", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 422 || !bytes.Contains(b, []byte("maxSzie")) || !bytes.Contains(b, []byte("ghost")) {
			t.Fatalf("admin reload: %d %s", resp.StatusCode, b)
		}
		// Restore, reload, still serving.
		if err := os.WriteFile(p.cfgPath, good, 0o600); err != nil {
			t.Fatal(err)
		}
		resp, err = http.Post("http://"+p.admin+"/v1/admin/reload", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("good reload: %d", resp.StatusCode)
		}
		viaGateway(t, p, w.target.URL()+"/after-good-reload")
	})

	t.Run("SIGTERM drains and exits 0", func(t *testing.T) {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			t.Fatal("did not exit within 20s of SIGTERM")
		}
		if p.exitCode != 0 {
			t.Fatalf("exit code %d", p.exitCode)
		}
	})
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", u, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// The same appliance on cluster storage: the activity pool in a real Redis,
// management state in a real PostgreSQL, both started by testenv.
func TestEndToEndClusterStorage(t *testing.T) {
	w := newWorld(t, 3)
	p, _, _ := startCluster(t, w, "")
	ids := map[string]bool{}
	for _, u := range w.upstreams {
		ids[u.ID()] = true
	}
	if r := viaGateway(t, p, w.target.URL()+"/cluster"); !ids[r.UpstreamProxy] {
		t.Fatalf("target saw %+v", r)
	}
	resp, err := http.Post("http://"+p.dist+"/v1/extract", "application/json", strings.NewReader(`{"count": 1, "fulfillment": "allOrNothing"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"returned":1`)) {
		t.Fatalf("extract on Redis: %d %s", resp.StatusCode, b)
	}
	// Fetching is led through Redis, and the gateway heartbeats there.
	var ups struct {
		Upstreams []struct {
			Name  string
			Fetch struct {
				Leader      bool
				LeaderError string
			}
		}
	}
	getJSON(t, "http://"+p.admin+"/v1/admin/upstreams", &ups)
	if len(ups.Upstreams) != 1 || !ups.Upstreams[0].Fetch.Leader || ups.Upstreams[0].Fetch.LeaderError != "" {
		t.Fatalf("upstreams %+v, want this controller leading", ups)
	}
	var st struct {
		LiveWorkers []struct {
			ID   string
			Info map[string]string
		}
	}
	getJSON(t, "http://"+p.admin+"/v1/admin/status", &st)
	if len(st.LiveWorkers) != 1 || st.LiveWorkers[0].ID == "" || st.LiveWorkers[0].Info["version"] == "" {
		t.Fatalf("live workers %+v, want this process's gateway", st.LiveWorkers)
	}
	// An admin write lands in PostgreSQL's audit log.
	resp, err = http.Post("http://"+p.admin+"/v1/admin/upstreams/vendor/disable", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("disable: %d", resp.StatusCode)
	}
	var audit struct {
		Entries []struct{ Action, Target, Result string }
	}
	getJSON(t, "http://"+p.admin+"/v1/admin/audit?limit=5", &audit)
	if len(audit.Entries) == 0 || audit.Entries[0].Action != "upstream.disable" || audit.Entries[0].Target != "vendor" {
		t.Fatalf("audit %+v", audit)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("did not exit after SIGTERM")
	}
	if p.exitCode != 0 {
		t.Fatalf("exit code %d", p.exitCode)
	}
}

// A provider is a file: dropped into the plugins directory and picked up by
// a reload, with no rebuild. A broken edit keeps the running version; a
// plugin the config still names cannot be removed.
func TestEndToEndPluginReload(t *testing.T) {
	plugins := t.TempDir()
	src, err := os.ReadFile("../../plugins/json-envelope.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plugins, "json-envelope.yaml"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, 2)
	p := startWith(t, w, "", nil, plugins)
	reload := func() (int, string) {
		resp, err := http.Post("http://"+p.admin+"/v1/admin/reload", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// A second vendor served as text lines (ip:port:user:pass, so no colon
	// in the password), through a plugin that does not exist yet: drop it
	// in, add the upstream, reload.
	w2 := newWorldPass(t, 2, "plainpass")
	lines, err := os.ReadFile("../../plugins/text-lines.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plugins, "text-lines.yaml"), lines, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(p.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	withSecond := strings.Replace(string(cfg), "extraction:", fmt.Sprintf(`  - name: second
    provider:
      plugin: text-lines
      params: {url: "%s/v1/proxies?format=text&key=vendor-key", ttl: "600"}
    fetch: {requestInterval: 100ms}
    pool: {minimum: 2, target: 2, maxSize: 4}
extraction:`, w2.vendor.URL()), 1)
	if err := os.WriteFile(p.cfgPath, []byte(withSecond), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := reload(); code != 200 {
		t.Fatalf("reload with a new plugin: %d %s", code, body)
	}
	eventually(t, 20*time.Second, "proxies from the new provider", func() bool {
		var body struct {
			Upstreams []struct {
				Name      string
				Available int
			}
		}
		getJSON(t, "http://"+p.admin+"/v1/admin/upstreams", &body)
		for _, u := range body.Upstreams {
			if u.Name == "second" && u.Available > 0 {
				return true
			}
		}
		return false
	})

	// A broken edit: the reload succeeds with the previous version kept, and
	// fetching through it goes on.
	if err := os.WriteFile(filepath.Join(plugins, "text-lines.yaml"), []byte("abi: 1\nname: text-lines\nrequest: {url: '1 +'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	calls := w2.vendor.Calls()
	if code, body := reload(); code != 200 {
		t.Fatalf("reload with a broken plugin must keep its previous version: %d %s", code, body)
	}
	if !strings.Contains(p.logs.String(), "keeping its previous version") {
		t.Fatal("the broken plugin was not reported")
	}
	// Taking the second upstream's proxies makes its runtime fetch again,
	// through the version of text-lines that loaded before the bad edit.
	resp, err := http.Post("http://"+p.dist+"/v1/extract", "application/json", strings.NewReader(`{"count": 2, "fulfillment": "partial", "filters": {"upstreams": ["second"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eventually(t, 20*time.Second, "the previous text-lines version still fetching", func() bool {
		return w2.vendor.Calls() > calls
	})
	if strings.Contains(p.logs.String(), "pre-checking provider") {
		t.Fatal("the broken edit reached the provider runtime")
	}

	// Removing a plugin the config names fails validation and changes nothing.
	if err := os.Remove(filepath.Join(plugins, "text-lines.yaml")); err != nil {
		t.Fatal(err)
	}
	code, body := reload()
	if code != 422 || !strings.Contains(body, `plugin \"text-lines\" not found`) {
		t.Fatalf("reload after removing a referenced plugin: %d %s", code, body)
	}
	viaGateway(t, p, w.target.URL()+"/still-serving")
}
