package httpapi

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/extraction"
)

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// distributionWith serves a distribution API with surface s and returns
// its URL and the fake behind it.
func distributionWith(t *testing.T, s config.Surface) (string, *fakeExtractor, *DistributionHandler) {
	t.Helper()
	ex := &fakeExtractor{res: extraction.Result{Requested: 1}}
	d, err := NewDistribution(DistributionOptions{Extractor: ex, Surface: s, Registry: newRegistry(), Logger: quiet, Now: fixedTS})
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, d).URL, ex, d
}

func TestAuthModes(t *testing.T) {
	users := []config.User{{Username: "alice", Password: secret(t, "wonder-land")}}
	keys := []config.APIKey{{Name: "ci", Key: secret(t, "key-123")}}
	tokens := []config.APIKey{{Name: "grafana", Key: secret(t, "tok-456")}}
	const (
		basicChallenge  = `Basic realm="proxypool-distribution", charset="UTF-8"`
		keyChallenge    = `ApiKey realm="proxypool-distribution"`
		bearerChallenge = `Bearer realm="proxypool-distribution"`
	)
	type attempt struct {
		name      string
		headers   map[string]string
		code      int
		principal string
	}
	tests := []struct {
		name       string
		auth       config.Auth
		challenges []string
		attempts   []attempt
	}{
		{"none", config.Auth{Mode: "none"}, nil, []attempt{
			{"no credentials", nil, 200, "anonymous"},
			{"ignored credentials", map[string]string{"X-API-Key": "whatever"}, 200, "anonymous"},
		}},
		{"usernamePassword", config.Auth{Mode: "usernamePassword", Users: users}, []string{basicChallenge}, []attempt{
			{"valid", map[string]string{"Authorization": basic("alice", "wonder-land")}, 200, "alice"},
			{"password with colon", map[string]string{"Authorization": basic("alice", "wonder-land:")}, 401, ""},
			{"wrong password", map[string]string{"Authorization": basic("alice", "wonderland")}, 401, ""},
			{"unknown user", map[string]string{"Authorization": basic("bob", "wonder-land")}, 401, ""},
			{"malformed basic", map[string]string{"Authorization": "Basic !!!"}, 401, ""},
			{"none", nil, 401, ""},
			{"api key instead", map[string]string{"X-API-Key": "key-123"}, 401, ""},
		}},
		{"apiKey", config.Auth{Mode: "apiKey", APIKeys: keys}, []string{keyChallenge}, []attempt{
			{"valid", map[string]string{"X-API-Key": "key-123"}, 200, "ci"},
			{"wrong", map[string]string{"X-API-Key": "key-124"}, 401, ""},
			{"as bearer", map[string]string{"Authorization": "Bearer key-123"}, 401, ""},
			{"none", nil, 401, ""},
		}},
		{"bearer", config.Auth{Mode: "bearer", Tokens: tokens}, []string{bearerChallenge}, []attempt{
			{"valid", map[string]string{"Authorization": "Bearer tok-456"}, 200, "grafana"},
			{"scheme is case-insensitive", map[string]string{"Authorization": "bearer tok-456"}, 200, "grafana"},
			{"wrong", map[string]string{"Authorization": "Bearer tok-457"}, 401, ""},
			{"empty token", map[string]string{"Authorization": "Bearer "}, 401, ""},
			{"as api key", map[string]string{"X-API-Key": "tok-456"}, 401, ""},
			{"none", nil, 401, ""},
		}},
		{"ipWhitelist allows loopback", config.Auth{Mode: "ipWhitelist", IPs: []string{"127.0.0.1"}}, nil, []attempt{
			{"loopback", nil, 200, "ip:127.0.0.1"},
		}},
		{"ipWhitelist refuses others", config.Auth{Mode: "ipWhitelist", IPs: []string{"192.0.2.0/24"}}, nil, []attempt{
			// No credential can help: 403, not 401.
			{"loopback", map[string]string{"X-API-Key": "key-123"}, 403, ""},
		}},
		{"any", config.Auth{Mode: "any", Users: users, APIKeys: keys, Tokens: tokens, IPs: []string{"192.0.2.0/24"}},
			[]string{basicChallenge, keyChallenge, bearerChallenge}, []attempt{
				{"basic", map[string]string{"Authorization": basic("alice", "wonder-land")}, 200, "alice"},
				{"key", map[string]string{"X-API-Key": "key-123"}, 200, "ci"},
				{"bearer", map[string]string{"Authorization": "Bearer tok-456"}, 200, "grafana"},
				{"nothing", nil, 401, ""},
				{"all wrong", map[string]string{"Authorization": "Bearer x", "X-API-Key": "y"}, 401, ""},
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url, ex, _ := distributionWith(t, config.Surface{Auth: tc.auth})
			for _, a := range tc.attempts {
				t.Run(a.name, func(t *testing.T) {
					*ex = fakeExtractor{}
					r := do(t, url, call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: a.headers})
					if r.code != a.code {
						t.Fatalf("status %d, want %d (%s)", r.code, a.code, r.body)
					}
					req, n := ex.calls()
					if a.code != 200 {
						checkProblem(t, r)
						if n != 0 {
							t.Error("extractor called for a refused client")
						}
					} else if req.Client != a.principal {
						t.Errorf("principal %q, want %q", req.Client, a.principal)
					}
					if a.code == 401 && !slices.Equal(r.header.Values("WWW-Authenticate"), tc.challenges) {
						t.Errorf("WWW-Authenticate = %q, want %q", r.header.Values("WWW-Authenticate"), tc.challenges)
					}
					if a.code != 401 && len(r.header.Values("WWW-Authenticate")) > 0 {
						t.Errorf("WWW-Authenticate on %d", a.code)
					}
				})
			}
		})
	}
}

// The test listener's peer is always 127.0.0.1; other client addresses
// arrive through X-Forwarded-For from a trusted (or untrusted) loopback.
func TestAccessAndForwardedFor(t *testing.T) {
	keys := []config.APIKey{{Name: "ci", Key: secret(t, "key-123")}}
	withKey := func(h map[string]string) map[string]string {
		out := map[string]string{"X-API-Key": "key-123"}
		for k, v := range h {
			out[k] = v
		}
		return out
	}
	tests := []struct {
		name    string
		surface config.Surface
		headers map[string]string
		code    int
		client  string // principal under ipWhitelist
	}{
		{"loopback not in allowCIDRs",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"10.0.0.0/8"}}},
			withKey(nil), 403, ""},
		{"allowCIDRs checked before auth",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"10.0.0.0/8"}}},
			nil, 403, ""},
		{"allowed address still needs credentials",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"127.0.0.0/8"}}},
			nil, 401, ""},
		{"allowed address with credentials",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"127.0.0.0/8"}}},
			withKey(nil), 200, ""},
		{"forwarded-for ignored from untrusted peer",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"10.0.0.0/8"}}, TrustedProxies: []string{"192.0.2.1"}},
			withKey(map[string]string{"X-Forwarded-For": "10.1.2.3"}), 403, ""},
		{"forwarded-for believed from trusted peer",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"10.0.0.0/8"}}, TrustedProxies: []string{"127.0.0.1"}},
			withKey(map[string]string{"X-Forwarded-For": "10.1.2.3"}), 200, ""},
		{"spoofed left-most entry does not help",
			config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: keys}, Access: config.Access{AllowCIDRs: []string{"10.0.0.0/8"}}, TrustedProxies: []string{"127.0.0.1"}},
			withKey(map[string]string{"X-Forwarded-For": "10.1.2.3, 198.51.100.4"}), 403, ""},
		{"chain through trusted proxies",
			config.Surface{Auth: config.Auth{Mode: "ipWhitelist", IPs: []string{"198.51.100.0/24"}}, TrustedProxies: []string{"127.0.0.1", "10.0.0.0/8"}},
			map[string]string{"X-Forwarded-For": "1.1.1.1, 198.51.100.4, 10.0.0.9\n10.0.0.8"}, 200, "ip:198.51.100.4"},
		{"ipWhitelist uses the resolved client",
			config.Surface{Auth: config.Auth{Mode: "ipWhitelist", IPs: []string{"127.0.0.1"}}, TrustedProxies: []string{"127.0.0.1"}},
			map[string]string{"X-Forwarded-For": "198.51.100.4"}, 403, ""},
		{"ipWhitelist ignores header from untrusted peer",
			config.Surface{Auth: config.Auth{Mode: "ipWhitelist", IPs: []string{"198.51.100.4"}}},
			map[string]string{"X-Forwarded-For": "198.51.100.4"}, 403, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url, ex, _ := distributionWith(t, tc.surface)
			r := do(t, url, call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: tc.headers})
			if r.code != tc.code {
				t.Fatalf("status %d, want %d (%s)", r.code, tc.code, r.body)
			}
			if r.code != 200 {
				checkProblem(t, r)
			}
			if req, _ := ex.calls(); tc.client != "" && req.Client != tc.client {
				t.Errorf("principal %q, want %q", req.Client, tc.client)
			}
		})
	}
}

func TestReconfigure(t *testing.T) {
	old := config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: []config.APIKey{{Name: "old", Key: secret(t, "old-key")}}}}
	url, ex, d := distributionWith(t, old)
	try := func(key string) int {
		return do(t, url, call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{"X-API-Key": key}}).code
	}
	if c := try("old-key"); c != 200 {
		t.Fatalf("old key: %d", c)
	}
	bad := config.Surface{Auth: config.Auth{Mode: "apiKey"}}
	if err := d.Reconfigure(bad, config.Extraction{}); err == nil {
		t.Fatal("Reconfigure accepted apiKey mode without keys")
	}
	if c := try("old-key"); c != 200 {
		t.Fatalf("failed reconfigure changed the rules: %d", c)
	}
	next := config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: []config.APIKey{{Name: "new", Key: secret(t, "new-key")}}}}
	if err := d.Reconfigure(next, config.Extraction{MaxCount: 1}); err != nil {
		t.Fatal(err)
	}
	if c := try("old-key"); c != 401 {
		t.Errorf("old key after swap: %d", c)
	}
	if c := try("new-key"); c != 200 {
		t.Errorf("new key after swap: %d", c)
	}
	if req, _ := ex.calls(); req.Client != "new" {
		t.Errorf("principal %q", req.Client)
	}
	r := do(t, url, call{method: "POST", path: "/v1/extract", body: `{"count":2}`, headers: map[string]string{"X-API-Key": "new-key"}})
	if r.code != 400 || !strings.Contains(r.problem(t).Detail, "at most 1") {
		t.Errorf("maxCount not swapped: %d %s", r.code, r.body)
	}
}

func TestUnmatched(t *testing.T) {
	reg := newRegistry()
	key := secret(t, "key-123")
	d, err := NewDistribution(DistributionOptions{
		Extractor: &fakeExtractor{},
		Surface:   config.Surface{Auth: config.Auth{Mode: "apiKey", APIKeys: []config.APIKey{{Key: key}}}},
		Registry:  reg, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, d).URL
	auth := map[string]string{"X-API-Key": "key-123"}
	tests := []struct {
		name  string
		call  call
		code  int
		allow string
	}{
		{"unknown path", call{method: "GET", path: "/v1/nope", headers: auth}, 404, ""},
		{"unknown path needs auth first", call{method: "GET", path: "/v1/nope"}, 401, ""},
		{"wrong method", call{method: "GET", path: "/v1/extract", headers: auth}, 405, "POST"},
		{"wrong method delete", call{method: "DELETE", path: "/v1/extract", headers: auth}, 405, "POST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, url, tc.call)
			if r.code != tc.code {
				t.Fatalf("status %d, want %d", r.code, tc.code)
			}
			checkProblem(t, r)
			if got := r.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
		})
	}
	// Raw paths never become label values.
	for k := range observed(t, reg) {
		if strings.Contains(k, "nope") || !strings.HasPrefix(k, "distribution|unmatched|") {
			t.Errorf("unexpected series %s", k)
		}
	}
}

func TestConstructorsRefuse(t *testing.T) {
	tests := []struct {
		name string
		fn   func() error
	}{
		{"distribution without extractor", func() error {
			_, err := NewDistribution(DistributionOptions{Surface: openSurface()})
			return err
		}},
		{"distribution with bad cidr", func() error {
			s := openSurface()
			s.Access.AllowCIDRs = []string{"10.0.0.0/99"}
			_, err := NewDistribution(DistributionOptions{Extractor: &fakeExtractor{}, Surface: s})
			return err
		}},
		{"distribution with bad trusted proxy", func() error {
			s := openSurface()
			s.TrustedProxies = []string{"proxy.example"}
			_, err := NewDistribution(DistributionOptions{Extractor: &fakeExtractor{}, Surface: s})
			return err
		}},
		{"distribution with empty auth mode", func() error {
			_, err := NewDistribution(DistributionOptions{Extractor: &fakeExtractor{}})
			return err
		}},
		{"admin without reloader", func() error {
			_, err := NewAdmin(AdminOptions{Admin: &fakeAdmin{}, Surface: openSurface()})
			return err
		}},
		{"admin with bad auth", func() error {
			_, err := NewAdmin(AdminOptions{Admin: &fakeAdmin{}, Reloader: &fakeReloader{}, Surface: config.Surface{Auth: config.Auth{Mode: "bearer"}}})
			return err
		}},
		{"ops without gatherer", func() error {
			_, err := NewOps(OpsOptions{Readiness: &fakeReady{}})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.fn() == nil {
				t.Fatal("constructor accepted a broken configuration")
			}
		})
	}
}

// TestSharedRegistry: the three surfaces register on one registry.
func TestSharedRegistry(t *testing.T) {
	reg := newRegistry()
	if _, err := NewDistribution(DistributionOptions{Extractor: &fakeExtractor{}, Surface: openSurface(), Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewAdmin(AdminOptions{Admin: &fakeAdmin{}, Reloader: &fakeReloader{}, Surface: openSurface(), Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewOps(OpsOptions{Readiness: &fakeReady{}, Gatherer: reg, Registry: reg}); err != nil {
		t.Fatal(err)
	}
}

func TestNewServer(t *testing.T) {
	h := http.NotFoundHandler()
	s := NewServer(h, ServerLimits{WriteTimeout: 7})
	d := DefaultServerLimits()
	if s.Handler == nil || s.ReadHeaderTimeout != d.ReadHeaderTimeout || s.ReadTimeout != d.ReadTimeout ||
		s.WriteTimeout != 7 || s.IdleTimeout != d.IdleTimeout || s.MaxHeaderBytes != d.MaxHeaderBytes || s.ErrorLog == nil {
		t.Fatalf("server %+v", s)
	}
	if d.WriteTimeout <= DefaultRequestTimeout || d.WriteTimeout <= DefaultReloadTimeout {
		t.Fatal("default WriteTimeout would cut off a handler before its own timeout")
	}
	for _, v := range []int64{int64(d.ReadHeaderTimeout), int64(d.ReadTimeout), int64(d.IdleTimeout), int64(d.MaxHeaderBytes)} {
		if v <= 0 {
			t.Fatal("a default limit is unset")
		}
	}
}
