// Package gwtest holds what the gateway's tests share beyond testenv (whose
// simulated upstream proxies and target they use): snapshot builders, a
// TCP echo server, metric and polling helpers. It is imported by tests only
// and must never be imported by production code.
package gwtest

import (
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/testenv"
)

// Upstreams starts n simulated upstream proxies (testenv) sharing the
// credentials, closed when the test ends.
func Upstreams(t testing.TB, n int, user, pass string) []*testenv.UpstreamProxy {
	t.Helper()
	ups, err := testenv.StartUpstreams(n, user, pass)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, u := range ups {
			_ = u.Close()
		}
	})
	return ups
}

// Target starts a testenv target, closed when the test ends.
func Target(t testing.TB) *testenv.Target {
	t.Helper()
	tg, err := testenv.NewTarget("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	return tg
}

// ProxyOf returns the domain proxy for a testenv upstream in upstream,
// AVAILABLE and usable for an hour from now.
func ProxyOf(up *testenv.UpstreamProxy, upstream, user, pass string, now time.Time) proxy.Proxy {
	return MakeProxy(upstream, up.Host(), uint16(up.Port()), user, pass, now)
}

// MakeProxy builds an AVAILABLE http proxy usable for an hour from now.
func MakeProxy(upstream, host string, port uint16, user, pass string, now time.Time) proxy.Proxy {
	c := proxy.Candidate{Scheme: proxy.SchemeHTTP, Host: host, Port: port, Username: user, Password: pass}
	k := c.Key()
	return proxy.Proxy{
		ID: proxy.MakeID(k), Key: k, Password: pass, Upstream: upstream,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), UsableUntil: now.Add(time.Hour),
		MaxConcurrency: 32, State: proxy.StateAvailable,
	}
}

// Snapshot builds a snapshot with one catch-all least-connections rule over
// the upstreams of proxies (in first-seen order), valid for an hour.
func Snapshot(version uint64, now time.Time, proxies ...proxy.Proxy) *worker.Snapshot {
	var ups []string
	for _, p := range proxies {
		if !contains(ups, p.Upstream) {
			ups = append(ups, p.Upstream)
		}
	}
	if len(ups) == 0 {
		ups = []string{"none"}
	}
	return &worker.Snapshot{
		Version: version, GeneratedAt: now, ValidUntil: now.Add(time.Hour),
		Routings: []routing.Rule{{Name: "default", Upstreams: ups, Strategy: routing.LeastConnections,
			OnUnavailable: routing.Reject, MaxAttempts: 2}},
		Proxies: proxies,
	}
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// Serve runs handle on every connection to a fresh loopback listener,
// each in its own goroutine, until the test ends; it returns the address.
// It is the raw-TCP peer (upstream proxy, target) of tests that need one
// misbehaving in a way testenv does not script.
func Serve(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// NewEchoServer starts a TCP server that echoes until the client
// half-closes, then half-closes back. It returns the address.
func NewEchoServer(t testing.TB) string {
	t.Helper()
	return Serve(t, func(c net.Conn) {
		defer c.Close()
		_, _ = io.Copy(c, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
}

// SplitAddr splits a loopback host:port as Serve returns it.
func SplitAddr(t testing.TB, addr string) (string, uint16) {
	t.Helper()
	return splitAddr(t, addr)
}

// ClosedPort returns a loopback port nothing listens on.
func ClosedPort(t testing.TB) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port := splitAddr(t, ln.Addr().String())
	ln.Close()
	return port
}

func splitAddr(t testing.TB, addr string) (string, uint16) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return h, uint16(n)
}

// HasHeader reports whether h has name (any case).
func HasHeader(h http.Header, name string) bool {
	_, ok := h[textproto.CanonicalMIMEHeaderKey(name)]
	return ok
}

// Eventually polls cond until it holds or the deadline passes.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Metric reads one counter or gauge from g: the series of name whose labels
// include every name/value pair given; 0 when absent.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
