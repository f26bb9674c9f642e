package gateway_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/testenv"
)

func TestClientAuthModes(t *testing.T) {
	tg := gwtest.Target(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	pw := "file:" + writeSecret(t, "client-pass")
	key := "file:" + writeSecret(t, "key-1")
	tok := "file:" + writeSecret(t, "token-1")
	users := "    users: [{username: client, password: " + pw + "}]\n"
	keys := "    apiKeys: [{name: k1, key: " + key + "}]\n"
	tokens := "    bearerTokens: [{name: t1, key: " + tok + "}]\n"
	basic := func(up string) string { return "Basic " + base64Of(up) }
	type try struct {
		hdr    []string
		status int
	}
	tests := []struct {
		name      string
		auth      string
		challenge string
		tries     []try
	}{
		{"none", "    mode: none\n", "", []try{{nil, 200}}},
		{"usernamePassword", "    mode: usernamePassword\n" + users, `Basic realm="proxypool"`, []try{
			{nil, 407},
			{[]string{"Proxy-Authorization", basic("client:nope")}, 407},
			{[]string{"Proxy-Authorization", basic("mallory:client-pass")}, 407},
			{[]string{"Proxy-Authorization", "Basic !!!"}, 407},
			{[]string{"Proxy-Authorization", basic("client:client-pass")}, 200},
			{[]string{"Proxy-Authorization", basic("client-session-9:client-pass")}, 200},
		}},
		{"apiKey", "    mode: apiKey\n" + keys, `Basic realm="proxypool"`, []try{
			{nil, 407},
			{[]string{"X-Proxypool-Api-Key", "wrong"}, 407},
			{[]string{"X-Proxypool-Api-Key", "key-1"}, 200},
			{[]string{"Proxy-Authorization", basic("anyone:key-1")}, 200},
		}},
		{"bearer", "    mode: bearer\n" + tokens, `Basic realm="proxypool", Bearer realm="proxypool"`, []try{
			{nil, 407},
			{[]string{"Proxy-Authorization", "Bearer nope"}, 407},
			{[]string{"Proxy-Authorization", "Bearer token-1"}, 200},
			{[]string{"Proxy-Authorization", basic("x:token-1")}, 200},
		}},
		{"ipWhitelist admits loopback", "    mode: ipWhitelist\n    ips: [127.0.0.0/8]\n", "", []try{{nil, 200}}},
		{"ipWhitelist refuses others", "    mode: ipWhitelist\n    ips: [10.0.0.0/8]\n", "", []try{{nil, 403}}},
		{"any", "    mode: any\n" + users + keys + tokens, `Basic realm="proxypool", Bearer realm="proxypool"`, []try{
			{nil, 407},
			{[]string{"Proxy-Authorization", basic("client:client-pass")}, 200},
			{[]string{"X-Proxypool-Api-Key", "key-1"}, 200},
			{[]string{"Proxy-Authorization", "Bearer token-1"}, 200},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, baseConfig+"  auth:\n"+tc.auth)
			h.apply(t, snapshotOf(1, up))
			for i, tr := range tc.tries {
				resp, body := do(t, h.client(""), http.MethodGet, tg.URL()+"/a", nil, tr.hdr...)
				if resp.StatusCode != tr.status {
					t.Fatalf("try %d (%v): status %d, want %d", i, tr.hdr, resp.StatusCode, tr.status)
				}
				if tr.status == 407 && resp.Header.Get("Proxy-Authenticate") != tc.challenge {
					t.Fatalf("Proxy-Authenticate = %q, want %q", resp.Header.Get("Proxy-Authenticate"), tc.challenge)
				}
				if tr.status == 200 {
					rec := received(t, body)
					for _, h := range []string{"Proxy-Authorization", "X-Proxypool-Api-Key"} {
						if _, ok := rec.Headers[h]; ok {
							t.Fatalf("target received %s", h)
						}
					}
				}
			}
		})
	}
}

// access.allowCIDRs applies whatever the auth, to the client address,
// which X-Forwarded-For changes only when the peer is a trusted proxy.
func TestAccessAndTrustedProxies(t *testing.T) {
	tg := gwtest.Target(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	get := func(xff string) string {
		return fmt.Sprintf("GET %s/t HTTP/1.1\r\nHost: %s\r\nX-Forwarded-For: %s\r\n\r\n", tg.URL(), tg.Addr(), xff)
	}
	tests := []struct {
		name   string
		yaml   string
		xff    string
		status int
	}{
		{"untrusted peer cannot claim an allowed address", "  access:\n    allowCIDRs: [203.0.113.0/24]\n", "203.0.113.5", 403},
		{"trusted peer forwards an allowed address", "  access:\n    allowCIDRs: [203.0.113.0/24]\n  trustedProxies: [127.0.0.1/32]\n", "203.0.113.5", 200},
		{"trusted peer forwards a refused address", "  access:\n    allowCIDRs: [127.0.0.0/8]\n  trustedProxies: [127.0.0.1/32]\n", "198.51.100.7", 403},
		{"client-written entries left of the trusted chain are ignored", "  access:\n    allowCIDRs: [203.0.113.0/24]\n  trustedProxies: [127.0.0.1/32]\n", "203.0.113.5, 198.51.100.7", 403},
		{"allowCIDRs holds with valid credentials too", "  access:\n    allowCIDRs: [10.0.0.0/8]\n  auth:\n    mode: ipWhitelist\n    ips: [127.0.0.0/8]\n", "", 403},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, baseConfig+tc.yaml)
			h.apply(t, snapshotOf(1, up))
			if resp := h.raw(t, get(tc.xff)); resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"), tc.status)
			}
		})
	}
}

func stickyConfig(t *testing.T) string {
	return authConfig(t) + "routings:\n  - name: default\n    upstreams: [vendor]\n    sticky: {header: X-Session, maxEntries: 100}\n" +
		"upstreams:\n  - name: vendor\n    provider: {plugin: p}\n"
}

func TestStickySessionsEndToEnd(t *testing.T) {
	h := start(t, stickyConfig(t))
	tg := gwtest.Target(t)
	ups := gwtest.Upstreams(t, 4, upUser, upPass)
	ws := snapshotOf(1, ups...)
	ws.Routings[0].StickyHeader = "X-Session"
	h.apply(t, ws)
	via := func(t *testing.T, userinfo string, hdr ...string) string {
		resp, body := do(t, h.client(userinfo), http.MethodGet, tg.URL()+"/s", nil, hdr...)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d (%s)", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
		rec := received(t, body)
		if _, ok := rec.Headers["X-Session"]; ok {
			t.Fatal("session header reached the target")
		}
		return rec.UpstreamProxy
	}
	for _, tc := range []struct {
		name     string
		userinfo string
		hdr      []string
	}{
		{"header", "client:client-pass", []string{"X-Session", "abc"}},
		{"username convention", "client-session-xyz:client-pass", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := via(t, tc.userinfo, tc.hdr...)
			for range 10 {
				if got := via(t, tc.userinfo, tc.hdr...); got != first {
					t.Fatalf("session moved from %s to %s", first, got)
				}
			}
		})
	}
	t.Run("a failing proxy loses the session", func(t *testing.T) {
		first := via(t, "client:client-pass", "X-Session", "fail")
		for _, u := range ups {
			if u.ID() == first {
				if err := u.SetFault(testenv.FaultRefuse); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The bound proxy refuses: retried elsewhere, rebound.
		second := via(t, "client:client-pass", "X-Session", "fail")
		if second == first {
			t.Fatal("still on the failing proxy")
		}
		if third := via(t, "client:client-pass", "X-Session", "fail"); third != second {
			t.Fatalf("not rebound: %s then %s", second, third)
		}
	})
	if h.metric(t, "proxypool_gateway_sticky_lookups_total", "result", "hit") == 0 {
		t.Fatal("no sticky hit counted")
	}
}
