package transport_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
	"github.com/proxypool/proxypool/engine/gateway/transport"
	"github.com/proxypool/proxypool/testenv"
)

// target builds the snapshot target of p the way the gateway does.
func target(t *testing.T, p proxy.Proxy) *snapshot.Target {
	t.Helper()
	s, err := snapshot.Build(gwtest.Snapshot(1, time.Now(), p), snapshot.NewRegistry(0, nil))
	if err != nil {
		t.Fatal(err)
	}
	c := s.Rules()[0].Candidates()
	if len(c) != 1 {
		t.Fatal("proxy not allocatable")
	}
	return c[0].Target()
}

// get is a GET of rawURL as the client side hands it to the transport.
func get(t *testing.T, rawURL string) *transport.Request {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return &transport.Request{Method: http.MethodGet, Authority: []byte(u.Host), URI: []byte(u.RequestURI()),
		Header: []byte("Host: " + u.Host + "\r\n"), Idempotent: true}
}

// roundTrip sends req through target and returns the status and the whole
// body.
func roundTrip(tr *transport.Transport, req *transport.Request, target *snapshot.Target) (int, []byte, error) {
	var resp transport.Response
	if err := tr.RoundTrip(context.Background(), req, target, &resp); err != nil {
		return 0, nil, err
	}
	defer resp.Close()
	body, err := io.ReadAll(&resp.Body)
	return resp.Status, body, err
}

// silentProxy accepts connections and reads but never answers.
func silentProxy(t *testing.T) (string, uint16) {
	t.Helper()
	return gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}))
}

// scriptedProxy answers every connection with reply once it has read a
// request head.
func scriptedProxy(t *testing.T, reply string) (string, uint16) {
	t.Helper()
	return gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		_, _ = io.WriteString(c, reply)
		_, _ = io.Copy(io.Discard, br)
	}))
}

func TestRoundTripThroughUpstream(t *testing.T) {
	tg := gwtest.Target(t)
	up := gwtest.Upstreams(t, 1, "alice", "s3cret")[0]
	tr := transport.New(transport.Options{})
	defer tr.CloseIdleConnections()
	tgt := target(t, gwtest.ProxyOf(up, "u", "alice", "s3cret", time.Now()))
	for i := range 3 {
		status, body, err := roundTrip(tr, get(t, tg.URL()+"/x"+strconv.Itoa(i)), tgt)
		if err != nil {
			t.Fatal(err)
		}
		var rec testenv.Received
		err = json.Unmarshal(body, &rec)
		// The upstream demands credentials: a 200 proves they were sent.
		if err != nil || status != 200 || rec.Path != "/x"+strconv.Itoa(i) || rec.UpstreamProxy != up.ID() {
			t.Fatalf("response %d %+v %v", status, rec, err)
		}
	}
	if n := up.ActiveConns(); n != 1 {
		t.Fatalf("upstream proxy holds %d connections after 3 sequential requests, want 1 (kept alive, reused)", n)
	}
}

func TestRoundTripFailurePhases(t *testing.T) {
	tg := gwtest.Target(t)
	now := time.Now()
	silentHost, silentPort := silentProxy(t)
	authUp := gwtest.Upstreams(t, 1, "alice", "right")[0]
	tests := []struct {
		name  string
		proxy proxy.Proxy
		phase worker.Phase
		code  int
	}{
		{"connection refused", gwtest.MakeProxy("u", "127.0.0.1", gwtest.ClosedPort(t), "", "", now), worker.PhaseDial, 0},
		{"no response headers", gwtest.MakeProxy("u", silentHost, silentPort, "", "", now), worker.PhaseResponseHeaders, 0},
		{"wrong credentials", gwtest.ProxyOf(authUp, "u", "alice", "wrong", now), worker.PhaseProxyHandshake, 407},
	}
	tr := transport.New(transport.Options{ResponseHeaderTimeout: 200 * time.Millisecond, DialTimeout: time.Second})
	defer tr.CloseIdleConnections()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := roundTrip(tr, get(t, tg.URL()+"/"), target(t, tc.proxy))
			if err == nil {
				t.Fatal("round trip succeeded")
			}
			var te *transport.Error
			if !errors.As(err, &te) || te.Phase != tc.phase || transport.PhaseOf(err) != tc.phase {
				t.Fatalf("err = %v, want phase %s", err, tc.phase)
			}
			var se *transport.StatusError
			if tc.code != 0 && (!errors.As(err, &se) || se.Code != tc.code) {
				t.Fatalf("err = %v, want status %d", err, tc.code)
			}
		})
	}
}

func TestConnect(t *testing.T) {
	echo := gwtest.NewEchoServer(t)
	up := gwtest.Upstreams(t, 1, "alice", "s3cret")[0]
	tr := transport.New(transport.Options{})
	tun, err := tr.Connect(context.Background(), target(t, gwtest.ProxyOf(up, "u", "alice", "s3cret", time.Now())), echo)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Conn.Close()
	if _, ok := tun.Conn.(*net.TCPConn); !ok {
		t.Fatalf("tunnel conn is %T, want *net.TCPConn for splice", tun.Conn)
	}
	if _, err := io.WriteString(tun.Conn, "ping"); err != nil {
		t.Fatal(err)
	}
	_ = tun.Conn.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(tun.Conn)
	if err != nil || string(got) != "ping" {
		t.Fatalf("echo = %q, %v", got, err)
	}
}

func TestConnectKeepsEarlyBytes(t *testing.T) {
	host, port := scriptedProxy(t, "HTTP/1.1 200 Connection established\r\n\r\nSERVER-FIRST")
	tr := transport.New(transport.Options{})
	tun, err := tr.Connect(context.Background(), target(t, gwtest.MakeProxy("u", host, port, "", "", time.Now())), "example.com:25")
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Conn.Close()
	if string(tun.Buffered) != "SERVER-FIRST" {
		// The scripted reply may arrive in two segments; the rest is on
		// the connection.
		rest := make([]byte, len("SERVER-FIRST")-len(tun.Buffered))
		if _, err := io.ReadFull(tun.Conn, rest); err != nil || string(tun.Buffered)+string(rest) != "SERVER-FIRST" {
			t.Fatalf("early bytes lost: buffered %q rest %q", tun.Buffered, rest)
		}
	}
}

func TestConnectFailurePhases(t *testing.T) {
	now := time.Now()
	authUp := gwtest.Upstreams(t, 1, "alice", "right")[0]
	silentHost, silentPort := silentProxy(t)
	refuseHost, refusePort := scriptedProxy(t, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
	hugeHost, hugePort := scriptedProxy(t, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("a", 128<<10)+"\r\n\r\n")
	tests := []struct {
		name  string
		proxy proxy.Proxy
		phase worker.Phase
		code  int
	}{
		{"connection refused", gwtest.MakeProxy("u", "127.0.0.1", gwtest.ClosedPort(t), "", "", now), worker.PhaseDial, 0},
		{"wrong credentials", gwtest.ProxyOf(authUp, "u", "alice", "wrong", now), worker.PhaseProxyHandshake, 407},
		{"upstream refuses target", gwtest.MakeProxy("u", refuseHost, refusePort, "", "", now), worker.PhaseProxyHandshake, 502},
		{"no reply", gwtest.MakeProxy("u", silentHost, silentPort, "", "", now), worker.PhaseProxyHandshake, 0},
		{"oversized reply", gwtest.MakeProxy("u", hugeHost, hugePort, "", "", now), worker.PhaseProxyHandshake, 0},
	}
	tr := transport.New(transport.Options{HandshakeTimeout: 200 * time.Millisecond, DialTimeout: time.Second})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tun, err := tr.Connect(context.Background(), target(t, tc.proxy), "example.com:443")
			if err == nil {
				tun.Conn.Close()
				t.Fatal("connect succeeded")
			}
			if got := transport.PhaseOf(err); got != tc.phase {
				t.Fatalf("err = %v, want phase %s", err, tc.phase)
			}
			var se *transport.StatusError
			if tc.code != 0 && (!errors.As(err, &se) || se.Code != tc.code) {
				t.Fatalf("err = %v, want status %d", err, tc.code)
			}
		})
	}
}

func TestConnectCancelledByClient(t *testing.T) {
	host, port := silentProxy(t)
	tr := transport.New(transport.Options{HandshakeTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := tr.Connect(ctx, target(t, gwtest.MakeProxy("u", host, port, "", "", time.Now())), "example.com:443")
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("connect succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled handshake still waiting")
	}
}

func TestDirect(t *testing.T) {
	tg := gwtest.Target(t)
	tr := transport.New(transport.Options{DialTimeout: time.Second})
	defer tr.CloseIdleConnections()
	checked := []netip.AddrPort{netip.MustParseAddrPort(tg.Addr())}
	t.Run("round trip dials only the checked address", func(t *testing.T) {
		// The URL names a host nobody can resolve here: only the checked
		// address can make this work.
		req := get(t, "http://unresolvable.invalid/direct")
		var resp transport.Response
		if err := tr.DirectRoundTrip(context.Background(), req, checked, &resp); err != nil {
			t.Fatal(err)
		}
		var rec testenv.Received
		_ = json.NewDecoder(&resp.Body).Decode(&rec)
		resp.Close()
		if rec.Path != "/direct" || rec.UpstreamProxy != "" {
			t.Fatalf("target saw %+v", rec)
		}
	})
	t.Run("no checked address", func(t *testing.T) {
		err := tr.DirectRoundTrip(context.Background(), get(t, "http://other.invalid/"), nil, &transport.Response{})
		if transport.PhaseOf(err) != worker.PhaseDial {
			t.Fatalf("err = %v", err)
		}
		if _, err := tr.DirectConnect(context.Background(), nil); transport.PhaseOf(err) != worker.PhaseDial {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("connect", func(t *testing.T) {
		echo := gwtest.NewEchoServer(t)
		c, err := tr.DirectConnect(context.Background(), []netip.AddrPort{netip.MustParseAddrPort(echo)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "hi")
		_ = c.(*net.TCPConn).CloseWrite()
		if got, _ := io.ReadAll(c); string(got) != "hi" {
			t.Fatalf("echo %q", got)
		}
	})
}
