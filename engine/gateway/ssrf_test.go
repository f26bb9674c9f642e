package gateway_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// sentinel listens on every loopback address a hostile spelling below can
// reach, all on one port, and counts what arrives. Nothing may.
type sentinel struct {
	port     int
	accepted atomic.Int64
}

func newSentinel(t *testing.T) *sentinel {
	t.Helper()
	s := &sentinel{}
	for attempt := 0; attempt < 20; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{ln}
		ok := true
		for _, ip := range []string{"127.0.0.2", "127.255.255.254", "::1"} {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				if ip == "::1" {
					continue // no IPv6 loopback here: those spellings are refused anyway
				}
				ok = false
				break
			}
			lns = append(lns, l)
		}
		if !ok {
			for _, l := range lns {
				l.Close()
			}
			continue
		}
		s.port = port
		for _, l := range lns {
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					s.accepted.Add(1)
					c.Close()
				}
			}()
		}
		return s
	}
	t.Fatal("no port free on every loopback address")
	return nil
}

// dnsTable answers names from a table and leaves the rest (localhost) to
// the system resolver; it stands in for DNS, unreachable from here.
type dnsTable map[string][]string

func (d dnsTable) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if as, ok := d[host]; ok {
		var out []netip.Addr
		for _, a := range as {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

var hostileDNS = dnsTable{
	"rebind.test":  {"127.0.0.1"},
	"mixed.test":   {"93.184.216.34", "127.0.0.1"},
	"private.test": {"10.0.0.1"},
	"meta.test":    {"169.254.169.254"},
	"cgnat.test":   {"100.64.1.1"},
	"v6local.test": {"::1"},
	"mapped.test":  {"::ffff:127.0.0.1"},
	"denied.test":  {"203.0.113.9"},
}

// hostile lists destinations that must never be reached, in every
// spelling; each is tried as an absolute-form GET and as a CONNECT.
var hostile = []string{
	// 127.0.0.1 spelled every way.
	"127.0.0.1", "127.1", "127.0.1", "2130706433", "0x7f000001", "0x7F000001", "0x7f.0.0.1", "0x7f.1",
	"0177.0.0.1", "0177.1", "017700000001", "127.0.0.1.", "127.000.000.001",
	"localhost", "localhost.", "LOCALHOST", "LocalHost.",
	"[::1]", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[0:0:0:0:0:ffff:127.0.0.1]",
	"[::127.0.0.1]", "[64:ff9b::127.0.0.1]", "[64:ff9b:1::7f00:1]", "[2002:7f00:1::1]",
	"[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "[2001:db8::5efe:127.0.0.1]", "[fe80::1%25lo]",
	"127.0.0.2", "127.255.255.254",
	"rebind.test", "mixed.test", "v6local.test", "mapped.test",
	// The unspecified address reaches local listeners on Linux.
	"0.0.0.0", "0", "0.0", "[::]",
	// Other internal classes and configured ranges.
	"10.0.0.1", "012.0.0.1", "0xa.0.0.1", "167772161", "172.16.0.1", "192.168.0.1",
	"169.254.169.254", "[::ffff:a9fe:a9fe]", "[fd00:ec2::254]", "100.100.100.200", "100.64.0.1",
	"224.0.0.1", "255.255.255.255", "[ff02::1]", "[fc00::1]", "[fec0::1]",
	"private.test", "meta.test", "cgnat.test", "203.0.113.9", "denied.test",
}

const ssrfConfig = `
listeners:
  gateway: 127.0.0.1:0
shutdownTimeout: 300ms
security:
  deniedCIDRs: [203.0.113.0/24]
gateway:
  limits:
    dialTimeout: 2s
    responseHeaderTimeout: 2s
`

func TestSSRFGuard(t *testing.T) {
	if len(hostile) < 40 {
		t.Fatalf("only %d hostile destinations", len(hostile))
	}
	sent := newSentinel(t)
	ups := gwtest.Upstreams(t, 2, upUser, upPass)
	viaProxy := startWith(t, ssrfConfig, hostileDNS)
	viaProxy.apply(t, snapshotOf(1, ups...))
	direct := startWith(t, ssrfConfig, hostileDNS)
	direct.apply(t, directSnapshot(1))
	for _, gw := range []struct {
		name string
		h    *harness
	}{{"proxy", viaProxy}, {"direct", direct}} {
		for _, host := range hostile {
			authority := host + ":" + strconv.Itoa(sent.port)
			for _, method := range []string{"GET", "CONNECT"} {
				t.Run(gw.name+"/"+method+"/"+host, func(t *testing.T) {
					req := fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
					if method == "CONNECT" {
						req = fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
					}
					resp := gw.h.raw(t, req)
					reason := resp.Header.Get("X-Proxypool-Reason")
					if resp.StatusCode == http.StatusForbidden && reason == "denied-destination" {
						return
					}
					// A zoned address is refused as a bad target before any
					// lookup; every other spelling must reach the guard, so
					// that a parser gap cannot hide behind a 400.
					if resp.StatusCode == http.StatusBadRequest && reason == "bad-target" && strings.Contains(host, "%") {
						return
					}
					t.Fatalf("%s %s: %d %q, want 403 denied-destination", method, authority, resp.StatusCode, reason)
				})
			}
		}
	}
	if n := sent.accepted.Load(); n != 0 {
		t.Fatalf("%d connections reached a denied address", n)
	}
	if n := requests(ups); n != 0 {
		t.Fatalf("upstream proxies carried %d requests to denied destinations", n)
	}
	if n := viaProxy.metric(t, "proxypool_gateway_rejections_total", "reason", "denied-destination"); n < float64(len(hostile)) {
		t.Fatalf("only %v denials counted", n)
	}

	// The sentinel does see what the guard lets through (the loopback
	// opt-in): the zero above is not an accident of the setup.
	open := start(t, baseConfig)
	open.apply(t, directSnapshot(1))
	open.raw(t, fmt.Sprintf("GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", sent.port))
	if sent.accepted.Load() == 0 {
		t.Fatal("sentinel unreachable even when allowed")
	}
}

// The gateway's own listener is never a destination, even with the
// loopback opt-in: a request to it would loop through the proxies.
func TestSelfConnectionRefused(t *testing.T) {
	h := start(t, "")
	h.apply(t, directSnapshot(1))
	for _, req := range []string{
		fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", h.addr),
		fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", h.addr),
	} {
		resp := h.raw(t, req)
		if resp.StatusCode != 403 || resp.Header.Get("X-Proxypool-Reason") != "denied-destination" {
			t.Fatalf("%q: %d %q", firstLine(req), resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
	}
	if h.metric(t, "proxypool_gateway_client_connections_total") != 2 {
		t.Fatal("the refused requests looped back into the gateway")
	}
}
