package testenv

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
	"time"
)

func startUpstreams(t *testing.T, n int, user, pass string) []*UpstreamProxy {
	t.Helper()
	ups, err := StartUpstreams(n, user, pass)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, up := range ups {
			up.Close()
		}
	})
	return ups
}

func startTarget(t *testing.T, useTLS bool) *Target {
	t.Helper()
	newT := NewTarget
	if useTLS {
		newT = NewTLSTarget
	}
	tg, err := newT("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	return tg
}

// proxiedClient sends everything through up, as the gateway would.
func proxiedClient(t *testing.T, up *UpstreamProxy, user, pass string, tg *Target) *http.Client {
	proxyURL := &url.URL{Scheme: "http", Host: up.Addr()}
	if user != "" {
		proxyURL.User = url.UserPassword(user, pass)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL)}
	if tg != nil && tg.CertPool() != nil {
		tr.TLSClientConfig = tg.Client().Transport.(*http.Transport).TLSClientConfig
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func getJSON(t *testing.T, c *http.Client, u string) (*http.Response, Received) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	var rec Received
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
			t.Fatalf("decoding: %v", err)
		}
	}
	return resp, rec
}

// rawConnect opens a CONNECT tunnel by hand and returns the connection and
// the proxy's response to the CONNECT.
func rawConnect(t *testing.T, up *UpstreamProxy, target, auth string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", up.Addr(), 2*time.Second)
	if err != nil {
		t.Fatalf("dialing upstream: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: Basic " + auth + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("reading CONNECT response: %v", err)
	}
	return conn, br, resp
}

const basicUP = "dTpw" // base64("u:p")

func TestUpstreamForwardsHTTP(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 2, "u", "p")
	tg.Learn(ups)
	c := proxiedClient(t, ups[0], "u", "p", nil)

	var reused []bool
	for range 2 {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
		req, _ := http.NewRequest(http.MethodGet, tg.URL()+"/hello?x=1", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		req.Header.Set("Connection", "X-Drop-Me")
		req.Header.Set("X-Drop-Me", "1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var rec Received
		err = json.NewDecoder(resp.Body).Decode(&rec)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Header.Get(UpstreamHeader); got != "up-1" {
			t.Fatalf("response %s = %q", UpstreamHeader, got)
		}
		if rec.UpstreamProxy != "up-1" || rec.Path != "/hello" || rec.Query != "x=1" {
			t.Fatalf("target saw %+v", rec)
		}
		for _, h := range []string{"Proxy-Authorization", "X-Drop-Me", "Proxy-Connection"} {
			if _, ok := rec.Headers[h]; ok {
				t.Fatalf("hop-by-hop header %s forwarded: %v", h, rec.Headers)
			}
		}
	}
	if len(reused) != 2 || !reused[1] {
		t.Fatalf("client connection not kept alive: reused=%v", reused)
	}
	if ups[0].Requests() != 2 || ups[1].Requests() != 0 {
		t.Fatalf("Requests = %d, %d", ups[0].Requests(), ups[1].Requests())
	}
	eventually(t, 2*time.Second, "one active client connection", func() bool { return ups[0].ActiveConns() == 1 })
	c.CloseIdleConnections()
	eventually(t, 2*time.Second, "no active connections", func() bool { return ups[0].ActiveConns() == 0 })
}

func TestUpstreamConnectTunnelsTLS(t *testing.T) {
	tg := startTarget(t, true)
	ups := startUpstreams(t, 2, "u", "p")
	tg.Learn(ups)
	if ups[1].DialSource() == "" {
		t.Skip("cannot bind 127.0.0.x source addresses on this OS")
	}
	resp, rec := getJSON(t, proxiedClient(t, ups[1], "u", "p", tg), tg.URL()+"/inside")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if rec.UpstreamProxy != "up-2" || !strings.HasPrefix(rec.RemoteAddr, "127.0.0.22:") {
		t.Fatalf("target saw upstream %q from %s, want up-2 from 127.0.0.22", rec.UpstreamProxy, rec.RemoteAddr)
	}
	if ups[1].Connects() != 1 || ups[1].Requests() != 0 {
		t.Fatalf("Connects=%d Requests=%d", ups[1].Connects(), ups[1].Requests())
	}
}

func TestUpstreamConnectPlainHTTPInsideTunnel(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 1, "u", "p")
	tg.Learn(ups)
	conn, br, resp := rawConnect(t, ups[0], tg.Addr(), basicUP)
	if resp.StatusCode != 200 || resp.Header.Get(UpstreamHeader) != "up-1" {
		t.Fatalf("CONNECT: %d %v", resp.StatusCode, resp.Header)
	}
	for i := range 2 { // two requests prove the tunnel carries a keep-alive connection
		fmt.Fprintf(conn, "GET /in/%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, tg.Addr())
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		var rec Received
		err = json.NewDecoder(r.Body).Decode(&rec)
		r.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if ups[0].DialSource() != "" && rec.UpstreamProxy != "up-1" {
			t.Fatalf("target attributed tunnel to %q", rec.UpstreamProxy)
		}
		if _, ok := rec.Headers[UpstreamHeader]; ok {
			t.Fatal("header injected inside a tunnel")
		}
	}
}

// TestUpstreamTunnelHalfClose checks that EOF travels both ways separately:
// the server only answers after it has seen the client's EOF.
func TestUpstreamTunnelHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "got %d bytes", n)
	}()
	ups := startUpstreams(t, 1, "", "")
	conn, br, resp := rawConnect(t, ups[0], ln.Addr().String(), "")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT status %d", resp.StatusCode)
	}
	io.WriteString(conn, "hello")
	conn.(*net.TCPConn).CloseWrite()
	reply, err := io.ReadAll(br)
	if err != nil || string(reply) != "got 5 bytes" {
		t.Fatalf("reply %q err %v", reply, err)
	}
	eventually(t, 2*time.Second, "tunnel closed", func() bool { return ups[0].ActiveConns() == 0 })
}

func TestUpstreamRequiresAuth(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 1, "u", "p")
	for _, c := range []*http.Client{proxiedClient(t, ups[0], "", "", nil), proxiedClient(t, ups[0], "u", "wrong", nil)} {
		resp, _ := getJSON(t, c, tg.URL())
		if resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") != `Basic realm="upstream"` {
			t.Fatalf("status %d, Proxy-Authenticate %q", resp.StatusCode, resp.Header.Get("Proxy-Authenticate"))
		}
	}
	if _, _, resp := rawConnect(t, ups[0], tg.Addr(), ""); resp.StatusCode != 407 {
		t.Fatalf("CONNECT without auth: %d", resp.StatusCode)
	}
	if tg.Count() != 0 || ups[0].Requests() != 0 || ups[0].Connects() != 0 {
		t.Fatal("unauthenticated request reached the target")
	}
}

func TestUpstreamRefusesNonLoopbackTargets(t *testing.T) {
	ups := startUpstreams(t, 1, "", "")
	resp, _ := getJSON(t, proxiedClient(t, ups[0], "", "", nil), "http://192.0.2.1/")
	if resp.StatusCode != 502 {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	if _, _, resp := rawConnect(t, ups[0], "example.com:443", ""); resp.StatusCode != 502 {
		t.Fatalf("CONNECT status %d, want 502", resp.StatusCode)
	}
}

func TestUpstreamFaultRefuse(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 1, "", "")
	up := ups[0]
	idle, err := net.Dial("tcp", up.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	eventually(t, 2*time.Second, "connection counted", func() bool { return up.ActiveConns() == 1 })

	if err := up.SetFault(FaultRefuse); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", up.Addr()); err == nil {
		c.Close()
		t.Fatal("dial succeeded while refusing")
	}
	idle.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isConnReset(err) {
		t.Fatalf("existing connection not closed: %v", err)
	}
	eventually(t, 2*time.Second, "no active connections", func() bool { return up.ActiveConns() == 0 })

	if err := up.SetFault(FaultNone); err != nil {
		t.Fatal(err)
	}
	if resp, rec := getJSON(t, proxiedClient(t, up, "", "", nil), tg.URL()); resp.StatusCode != 200 || rec.UpstreamProxy != "up-1" {
		t.Fatalf("after clearing: %d %+v", resp.StatusCode, rec)
	}
}

func isConnReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

func TestUpstreamFaultHandshake(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 1, "u", "p")
	c := proxiedClient(t, ups[0], "u", "p", nil)
	for _, tc := range []struct {
		fault  UpstreamFault
		status int
	}{{FaultHandshake407, 407}, {FaultHandshake502, 502}} {
		ups[0].SetFault(tc.fault)
		if resp, _ := getJSON(t, c, tg.URL()); resp.StatusCode != tc.status {
			t.Fatalf("%v: GET status %d", tc.fault, resp.StatusCode)
		}
		if _, _, resp := rawConnect(t, ups[0], tg.Addr(), basicUP); resp.StatusCode != tc.status {
			t.Fatalf("%v: CONNECT status %d", tc.fault, resp.StatusCode)
		}
	}
	if tg.Count() != 0 {
		t.Fatal("faulty handshake reached the target")
	}
}

func TestUpstreamFaultSlow(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 1, "", "")
	up := ups[0]
	up.SetFault(FaultSlow)
	up.SetSlowDelay(150 * time.Millisecond)
	c := proxiedClient(t, up, "", "", nil)
	start := time.Now()
	if resp, _ := getJSON(t, c, tg.URL()); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("answered after %v, want >= 150ms", d)
	}
	c.CloseIdleConnections()
	eventually(t, 2*time.Second, "idle connection closed", func() bool { return up.ActiveConns() == 0 })

	// A long delay must not outlive Close.
	up.SetSlowDelay(time.Minute)
	conn, err := net.Dial("tcp", up.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s/ HTTP/1.1\r\nHost: %s\r\n\r\n", tg.URL(), tg.Addr())
	eventually(t, 2*time.Second, "request in flight", func() bool { return up.ActiveConns() == 1 })
	closed := make(chan error, 1)
	go func() { closed <- up.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked by a slow request")
	}
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes from a closed proxy", n)
	}
}

func TestUpstreamFaultDropMidResponse(t *testing.T) {
	tg := startTarget(t, false)
	ups := startUpstreams(t, 1, "", "")
	up := ups[0]
	up.SetFault(FaultDropMidResponse)

	resp, err := proxiedClient(t, up, "", "", nil).Get(tg.URL() + "/bytes/1000")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != 1000 || len(body) != 500 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("status %d length %d got %d bytes, err %v; want 500 of 1000 bytes then unexpected EOF",
			resp.StatusCode, resp.ContentLength, len(body), err)
	}

	_, br, cresp := rawConnect(t, up, tg.Addr(), "")
	if cresp.StatusCode != 200 {
		t.Fatalf("CONNECT status %d", cresp.StatusCode)
	}
	if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("tunnel stayed open: n=%d err=%v", n, err)
	}
	if tg.Count() != 1 {
		t.Fatalf("target count %d, want only the HTTP request", tg.Count())
	}
}

func TestUpstreamConfigValidation(t *testing.T) {
	if _, err := NewUpstreamProxy(UpstreamConfig{DialSource: "192.0.2.1"}); err == nil {
		t.Fatal("non-loopback dial source accepted")
	}
	if _, err := NewUpstreamProxy(UpstreamConfig{Addr: "0.0.0.0:0"}); err == nil {
		t.Fatal("non-loopback listen address accepted")
	}
	if _, err := StartUpstreams(0, "", ""); err == nil {
		t.Fatal("StartUpstreams(0) accepted")
	}
	up, err := NewUpstreamProxy(UpstreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	if up.Host() != "127.0.0.1" || up.Port() == 0 || up.ID() != fmt.Sprintf("upstream-%d", up.Port()) {
		t.Fatalf("host %s port %d id %s", up.Host(), up.Port(), up.ID())
	}
}
