package checker

import (
	"context"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// revealingProxy is a real loopback forward proxy that reveals itself the
// way cheap vendor proxies do: it adds headers to the requests it
// forwards. It dials targets from its own loopback source address, so an
// echo service sees a different exit than our own 127.0.0.1.
type revealingProxy struct {
	srv  *http.Server
	addr string
}

func startRevealing(t *testing.T, source string, add func(h http.Header, client string)) *revealingProxy {
	t.Helper()
	if !canBind(source) {
		t.Skipf("cannot bind %s on this system", source)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	tr := &http.Transport{Proxy: nil, DialContext: dialer.DialContext, DisableKeepAlives: true}
	var wg sync.WaitGroup
	p := &revealingProxy{addr: ln.Addr().String()}
	p.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			up, err := dialer.DialContext(r.Context(), "tcp", r.Host)
			if err != nil {
				http.Error(w, "dial", http.StatusBadGateway)
				return
			}
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				_ = up.Close()
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			wg.Add(1)
			go func() {
				defer wg.Done()
				go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
				_, _ = io.Copy(c, up)
				_ = c.Close()
			}()
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.Header.Del("Proxy-Authorization")
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		add(out.Header, host)
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, "forward", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.srv.Close(); wg.Wait() })
	return p
}

func canBind(ip string) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

func plainProxy(t *testing.T, addr string) proxy.Proxy {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	var n uint16
	for _, c := range port {
		n = n*10 + uint16(c-'0')
	}
	key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: host, Port: n}
	return proxy.Proxy{ID: proxy.MakeID(key), Key: key, Upstream: "vendor-a"}
}

func startTarget(t *testing.T) *testenv.Target {
	t.Helper()
	tg, err := testenv.NewTarget("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	return tg
}

func TestEgressCheck(t *testing.T) {
	echo := startTarget(t) // testenv's target reports the remote address and headers it saw
	ups, err := testenv.StartUpstreams(1, "u", "secret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ups[0].Close() })
	if ups[0].DialSource() == "" {
		t.Skip("upstreams cannot dial from distinct loopback addresses here")
	}
	direct, err := testenv.NewUpstreamProxy(testenv.UpstreamConfig{}) // exits from 127.0.0.1: us
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	anonymous := startRevealing(t, "127.0.0.41", func(h http.Header, _ string) { h.Set("Via", "1.1 cheap-proxy") })
	transparent := startRevealing(t, "127.0.0.42", func(h http.Header, client string) {
		h.Set("X-Forwarded-For", client)
	})

	elite := proxyFor(t, ups[0], "u", "secret")
	cases := []struct {
		name        string
		p           proxy.Proxy
		url         string
		wantOK      bool
		wantPhase   Phase
		wantExit    string
		wantLeak    bool
		wantHeaders []string
	}{
		{name: "elite", p: elite, url: echo.URL() + "/ip", wantOK: true, wantExit: ups[0].DialSource()},
		{name: "anonymous reveals a proxy", p: plainProxy(t, anonymous.addr), url: echo.URL() + "/ip", wantOK: true, wantExit: "127.0.0.41", wantHeaders: []string{"Via"}},
		{name: "transparent leaks our address", p: plainProxy(t, transparent.addr), url: echo.URL() + "/ip", wantOK: true, wantExit: "127.0.0.42", wantLeak: true, wantHeaders: []string{"X-Forwarded-For"}},
		{name: "exit is our own address", p: plainProxy(t, direct.Addr()), url: echo.URL() + "/ip", wantOK: true, wantExit: "127.0.0.1", wantLeak: true},
		{name: "echo error status", p: elite, url: echo.URL() + "/status/503", wantPhase: PhaseStatus},
		{name: "not an echo", p: elite, url: echo.URL() + "/bytes/12", wantPhase: PhaseEcho},
		{name: "wrong password", p: func() proxy.Proxy { p := elite; p.Password = "nope"; return p }(), url: echo.URL() + "/ip", wantPhase: PhaseHandshake},
		{name: "echo unreachable", p: elite, url: "http://127.0.0.1:1/ip", wantPhase: PhaseStatus},
	}
	c := New(Options{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obs := c.Check(context.Background(), Task{Proxy: tc.p, Level: LevelEgress, URL: tc.url, Timeout: 3 * time.Second})
			if obs.Success != tc.wantOK || obs.Phase != tc.wantPhase || obs.Level != LevelEgress {
				t.Fatalf("obs = %+v; want success %v phase %s", obs, tc.wantOK, tc.wantPhase)
			}
			if obs.ExitIP != tc.wantExit || obs.AddressLeaked != tc.wantLeak || !reflect.DeepEqual(obs.ProxyHeaders, tc.wantHeaders) {
				t.Fatalf("exit %q leaked %v headers %v; want %q %v %v", obs.ExitIP, obs.AddressLeaked, obs.ProxyHeaders, tc.wantExit, tc.wantLeak, tc.wantHeaders)
			}
			if strings.Contains(obs.Err, "secret") || strings.Contains(obs.Err, tc.url) {
				t.Fatalf("observation error leaks the password or URL: %q", obs.Err)
			}
		})
	}
}

func TestTargetCheck(t *testing.T) {
	tg := startTarget(t)
	up, err := testenv.NewUpstreamProxy(testenv.UpstreamConfig{Username: "u", Password: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	good := proxyFor(t, up, "u", "secret")
	bad := proxyFor(t, up, "u", "wrong")
	cases := []struct {
		name       string
		p          proxy.Proxy
		url        string
		expect     int
		fault      testenv.UpstreamFault
		wantOK     bool
		wantPhase  Phase
		wantStatus int
	}{
		{name: "200 by default", p: good, url: tg.URL() + "/status/200", wantOK: true, wantStatus: 200},
		{name: "expected 204", p: good, url: tg.URL() + "/status/204", expect: 204, wantOK: true, wantStatus: 204},
		{name: "blocked 403", p: good, url: tg.URL() + "/status/403", wantPhase: PhaseStatus, wantStatus: 403},
		{name: "proxy refuses credentials", p: bad, url: tg.URL() + "/", wantPhase: PhaseHandshake, wantStatus: 407},
		{name: "proxy down", p: good, url: tg.URL() + "/", fault: testenv.FaultRefuse, wantPhase: PhaseDial},
	}
	c := New(Options{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := up.SetFault(tc.fault); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = up.SetFault(testenv.FaultNone) })
			obs := c.Check(context.Background(), Task{Proxy: tc.p, Level: LevelTarget, Routing: "shop", URL: tc.url, ExpectStatus: tc.expect, Timeout: 3 * time.Second})
			if obs.Success != tc.wantOK || obs.Phase != tc.wantPhase || obs.Status != tc.wantStatus {
				t.Fatalf("obs = %+v; want success %v phase %s status %d", obs, tc.wantOK, tc.wantPhase, tc.wantStatus)
			}
			if obs.Routing != "shop" || obs.Level != LevelTarget {
				t.Fatalf("observation not attributed to its routing: %+v", obs)
			}
			if strings.Contains(obs.Err, "secret") || strings.Contains(obs.Err, "wrong") {
				t.Fatalf("observation error leaks a password: %q", obs.Err)
			}
		})
	}
	if n := tg.Count(); n == 0 {
		t.Fatal("the target never saw a check")
	}
}

func TestParseEchoAndLeaks(t *testing.T) {
	parse := []struct {
		name     string
		body     string
		ok       bool
		exit     string
		xffValue string
	}{
		{"plain ip", "203.0.113.7\n", true, "203.0.113.7", ""},
		{"testenv target", `{"remoteAddr":"127.0.0.21:5555","headers":{"X-Forwarded-For":"198.51.100.1"}}`, true, "127.0.0.21", "198.51.100.1"},
		{"httpbin origin list", `{"origin":"203.0.113.9, 10.0.0.1","headers":{"X-Forwarded-For":["a","b"]}}`, true, "203.0.113.9", "a"},
		{"ipv6 bracketed", `{"ip":"[2001:db8::1]:80"}`, true, "2001:db8::1", ""},
		{"ipv4-mapped", `{"ip":"::ffff:192.0.2.1"}`, true, "192.0.2.1", ""},
		{"no address", `{"headers":{}}`, false, "", ""},
		{"garbage", "xxxxxxxx", false, "", ""},
	}
	for _, tc := range parse {
		t.Run("parse "+tc.name, func(t *testing.T) {
			e, ok := ParseEcho([]byte(tc.body))
			if ok != tc.ok || e.Exit != tc.exit {
				t.Fatalf("ParseEcho = %+v %v, want exit %q ok %v", e, ok, tc.exit, tc.ok)
			}
			if tc.xffValue != "" && (len(e.Headers["X-Forwarded-For"]) == 0 || e.Headers["X-Forwarded-For"][0] != tc.xffValue) {
				t.Fatalf("headers = %v", e.Headers)
			}
		})
	}
	own := []string{"198.51.100.1"}
	leaks := []struct {
		name    string
		echo    Echo
		leaked  bool
		headers []string
	}{
		{"clean", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"User-Agent": {"x"}}}, false, nil},
		{"exit is us", Echo{Exit: "198.51.100.1"}, true, nil},
		{"xff names us", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1, 203.0.113.7"}}}, true, []string{"X-Forwarded-For"}},
		{"forwarded names us", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"Forwarded": {`for="198.51.100.1:4711";proto=http`}}}, true, []string{"Forwarded"}},
		{"prefix is not us", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"X-Forwarded-For": {"198.51.100.12"}}}, false, []string{"X-Forwarded-For"}},
		{"via only", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"Via": {"1.1 squid"}}}, false, []string{"Via"}},
		{"host header ignored", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"Host": {"198.51.100.1"}}}, false, nil},
		{"odd header names us", Echo{Exit: "203.0.113.7", Headers: map[string][]string{"X-Custom-Client": {"198.51.100.1"}}}, true, nil},
	}
	for _, tc := range leaks {
		t.Run("leaks "+tc.name, func(t *testing.T) {
			leaked, hs := Leaks(tc.echo, own)
			if leaked != tc.leaked || !reflect.DeepEqual(hs, tc.headers) {
				t.Fatalf("Leaks = %v %v, want %v %v", leaked, hs, tc.leaked, tc.headers)
			}
		})
	}
}

func FuzzParseEcho(f *testing.F) {
	for _, s := range []string{"1.2.3.4", `{"origin":"1.2.3.4, 5.6.7.8","headers":{"Via":["x"]}}`, `{"remoteAddr":"[::1]:1"}`, "{"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := ParseEcho(b)
		if ok {
			if _, valid := canonicalAddr(e.Exit); !valid {
				t.Fatalf("exit %q is not an address", e.Exit)
			}
		}
		_, _ = Leaks(e, []string{"127.0.0.1"})
	})
}
