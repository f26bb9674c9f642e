package auth

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/config"
)

// secret returns a resolved config.Secret holding value, through a file
// reference so tests need no environment.
func secret(t *testing.T, value string) config.Secret {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := config.ParseSecretRef("file:" + p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Resolve(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRegister(t *testing.T) {
	ctor := func(config.Auth) (Authenticator, error) { return none{}, nil }
	tests := []struct {
		name string
		mode string
		ctor Constructor
	}{
		{"duplicate", ModeNone, ctor},
		{"empty name", "", ctor},
		{"nil constructor", "testNil", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Register did not panic")
				}
			}()
			Register(tc.mode, tc.ctor)
		})
	}
	t.Run("builtins", func(t *testing.T) {
		want := []string{ModeAny, ModeAPIKey, ModeBearer, ModeIPWhitelist, ModeNone, ModeUsernamePassword}
		slices.Sort(want)
		if got := Modes(); !slices.Equal(got, want) {
			t.Fatalf("Modes() = %v, want %v", got, want)
		}
	})
	t.Run("config modes are all registered", func(t *testing.T) {
		for _, m := range config.AuthModes {
			if !slices.Contains(Modes(), m) {
				t.Errorf("config mode %q has no authenticator", m)
			}
		}
	})
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  config.Auth
		want string
	}{
		{"empty mode", config.Auth{}, "unknown auth mode"},
		{"unknown mode", config.Auth{Mode: "kerberos"}, "unknown auth mode"},
		{"no users", config.Auth{Mode: ModeUsernamePassword}, "no users"},
		{"unresolved password", config.Auth{Mode: ModeUsernamePassword, Users: []config.User{{Username: "u"}}}, "password is empty"},
		{"empty username", config.Auth{Mode: ModeUsernamePassword, Users: []config.User{{Password: secret(t, "p")}}}, "empty username"},
		{"no keys", config.Auth{Mode: ModeAPIKey}, "no apiKeys"},
		{"empty key", config.Auth{Mode: ModeAPIKey, APIKeys: []config.APIKey{{Name: "a", Key: secret(t, "")}}}, "key is empty"},
		{"no tokens", config.Auth{Mode: ModeBearer}, "no bearerTokens"},
		{"no ips", config.Auth{Mode: ModeIPWhitelist}, "no ips"},
		{"bad ip", config.Auth{Mode: ModeIPWhitelist, IPs: []string{"10.0.0.300"}}, "not a CIDR"},
		{"any with nothing", config.Auth{Mode: ModeAny}, "no users, apiKeys"},
		{"any with a bad member", config.Auth{Mode: ModeAny, IPs: []string{"nope"}}, "not a CIDR"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New() error = %v, want containing %q", err, tc.want)
			}
		})
	}
}

func TestAuthenticate(t *testing.T) {
	users := []config.User{{Username: "alice", Password: secret(t, "wonder")}, {Username: "bob", Password: secret(t, "builder")}}
	keys := []config.APIKey{{Name: "ci", Key: secret(t, "key-1")}, {Key: secret(t, "key-2")}}
	tokens := []config.APIKey{{Name: "grafana", Key: secret(t, "tok-1")}}
	ips := []string{"192.0.2.0/24", "2001:db8::1"}
	v4 := netip.MustParseAddr("192.0.2.7")
	other := netip.MustParseAddr("198.51.100.1")

	type check struct {
		name   string
		creds  Credentials
		ok     bool
		want   string // principal name
		method string
	}
	tests := []struct {
		name    string
		cfg     config.Auth
		schemes []Scheme
		checks  []check
	}{
		{"none", config.Auth{Mode: ModeNone}, nil, []check{
			{"anything", Credentials{}, true, AnonymousPrincipal, ModeNone},
		}},
		{"usernamePassword", config.Auth{Mode: ModeUsernamePassword, Users: users}, []Scheme{SchemeBasic}, []check{
			{"first user", Credentials{HasBasic: true, Username: "alice", Password: "wonder"}, true, "alice", ModeUsernamePassword},
			{"second user", Credentials{HasBasic: true, Username: "bob", Password: "builder"}, true, "bob", ModeUsernamePassword},
			{"wrong password", Credentials{HasBasic: true, Username: "alice", Password: "builder"}, false, "", ""},
			{"crossed users", Credentials{HasBasic: true, Username: "bob", Password: "wonder"}, false, "", ""},
			{"unknown user", Credentials{HasBasic: true, Username: "eve", Password: "wonder"}, false, "", ""},
			{"empty password", Credentials{HasBasic: true, Username: "alice"}, false, "", ""},
			{"no basic", Credentials{APIKey: "key-1"}, false, "", ""},
			{"prefix of password", Credentials{HasBasic: true, Username: "alice", Password: "wonde"}, false, "", ""},
		}},
		{"apiKey", config.Auth{Mode: ModeAPIKey, APIKeys: keys}, []Scheme{SchemeAPIKey}, []check{
			{"named key", Credentials{APIKey: "key-1"}, true, "ci", ModeAPIKey},
			{"unnamed key", Credentials{APIKey: "key-2"}, true, "apiKeys[1]", ModeAPIKey},
			{"wrong key", Credentials{APIKey: "key-3"}, false, "", ""},
			{"missing", Credentials{}, false, "", ""},
			{"key as bearer", Credentials{Bearer: "key-1"}, false, "", ""},
		}},
		{"bearer", config.Auth{Mode: ModeBearer, Tokens: tokens}, []Scheme{SchemeBearer}, []check{
			{"token", Credentials{Bearer: "tok-1"}, true, "grafana", ModeBearer},
			{"wrong token", Credentials{Bearer: "tok-2"}, false, "", ""},
			{"token as api key", Credentials{APIKey: "tok-1"}, false, "", ""},
		}},
		{"ipWhitelist", config.Auth{Mode: ModeIPWhitelist, IPs: ips}, nil, []check{
			{"in prefix", Credentials{RemoteIP: v4}, true, "ip:192.0.2.7", ModeIPWhitelist},
			{"mapped form", Credentials{RemoteIP: netip.MustParseAddr("::ffff:192.0.2.7")}, true, "ip:192.0.2.7", ModeIPWhitelist},
			{"single v6", Credentials{RemoteIP: netip.MustParseAddr("2001:db8::1")}, true, "ip:2001:db8::1", ModeIPWhitelist},
			{"outside", Credentials{RemoteIP: other}, false, "", ""},
			{"invalid address", Credentials{}, false, "", ""},
			{"credentials do not help", Credentials{RemoteIP: other, APIKey: "key-1"}, false, "", ""},
		}},
		{"any", config.Auth{Mode: ModeAny, Users: users, APIKeys: keys, Tokens: tokens, IPs: ips},
			[]Scheme{SchemeBasic, SchemeAPIKey, SchemeBearer}, []check{
				{"basic", Credentials{RemoteIP: other, HasBasic: true, Username: "alice", Password: "wonder"}, true, "alice", ModeUsernamePassword},
				{"api key", Credentials{RemoteIP: other, APIKey: "key-1"}, true, "ci", ModeAPIKey},
				{"bearer", Credentials{RemoteIP: other, Bearer: "tok-1"}, true, "grafana", ModeBearer},
				{"ip", Credentials{RemoteIP: v4}, true, "ip:192.0.2.7", ModeIPWhitelist},
				{"basic wins over ip", Credentials{RemoteIP: v4, HasBasic: true, Username: "bob", Password: "builder"}, true, "bob", ModeUsernamePassword},
				{"bad basic falls through to key", Credentials{RemoteIP: other, HasBasic: true, Username: "alice", Password: "x", APIKey: "key-2"}, true, "apiKeys[1]", ModeAPIKey},
				{"nothing valid", Credentials{RemoteIP: other, APIKey: "nope", Bearer: "nope"}, false, "", ""},
			}},
		{"any with ips only", config.Auth{Mode: ModeAny, IPs: ips}, nil, []check{
			{"ip", Credentials{RemoteIP: v4}, true, "ip:192.0.2.7", ModeIPWhitelist},
			{"other", Credentials{RemoteIP: other}, false, "", ""},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Schemes(); !slices.Equal(got, tc.schemes) {
				t.Errorf("Schemes() = %v, want %v", got, tc.schemes)
			}
			for _, c := range tc.checks {
				t.Run(c.name, func(t *testing.T) {
					p, ok := a.Authenticate(c.creds)
					if ok != c.ok || p.Name != c.want || p.Method != c.method {
						t.Fatalf("Authenticate() = %+v, %v; want {%s %s}, %v", p, ok, c.want, c.method, c.ok)
					}
				})
			}
		})
	}
}

func TestClientIP(t *testing.T) {
	trusted, err := ParsePrefixes([]string{"10.0.0.0/8", "::ffff:172.16.0.1", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	tests := []struct {
		name    string
		peer    netip.Addr
		xff     []string
		trusted []netip.Prefix
		want    netip.Addr
	}{
		{"no trusted proxies ignores header", a("10.0.0.1"), []string{"198.51.100.7"}, nil, a("10.0.0.1")},
		{"untrusted peer ignores header", a("203.0.113.1"), []string{"198.51.100.7"}, trusted, a("203.0.113.1")},
		{"trusted peer, one hop", a("10.0.0.1"), []string{"198.51.100.7"}, trusted, a("198.51.100.7")},
		{"spoofed left entries ignored", a("10.0.0.1"), []string{"1.1.1.1, 198.51.100.7"}, trusted, a("198.51.100.7")},
		{"chain of trusted proxies", a("10.0.0.1"), []string{"198.51.100.7, 10.1.1.1, 10.2.2.2"}, trusted, a("198.51.100.7")},
		{"several header lines", a("10.0.0.1"), []string{"9.9.9.9, 198.51.100.7", "10.1.1.1"}, trusted, a("198.51.100.7")},
		{"all trusted gives leftmost", a("10.0.0.1"), []string{"10.3.3.3, 10.1.1.1"}, trusted, a("10.3.3.3")},
		{"garbage stops at last good", a("10.0.0.1"), []string{"198.51.100.7, garbage, 10.1.1.1"}, trusted, a("10.1.1.1")},
		{"garbage right of client ignored when untrusted found first", a("10.0.0.1"), []string{"garbage, 198.51.100.7"}, trusted, a("198.51.100.7")},
		{"with port", a("10.0.0.1"), []string{"198.51.100.7:4711"}, trusted, a("198.51.100.7")},
		{"v6 with port", a("10.0.0.1"), []string{"[2001:db8::7]:4711"}, trusted, a("2001:db8::7")},
		{"v6 bracketed", a("10.0.0.1"), []string{"[2001:db8::7]"}, trusted, a("2001:db8::7")},
		{"mapped peer is trusted", a("::ffff:10.0.0.1"), []string{"198.51.100.7"}, trusted, a("198.51.100.7")},
		{"mapped trusted entry", a("10.0.0.1"), []string{"198.51.100.7, 172.16.0.1"}, trusted, a("198.51.100.7")},
		{"mapped client is unmapped", a("10.0.0.1"), []string{"::ffff:198.51.100.7"}, trusted, a("198.51.100.7")},
		{"empty entries skipped", a("10.0.0.1"), []string{" , 198.51.100.7 ,"}, trusted, a("198.51.100.7")},
		{"no header", a("10.0.0.1"), nil, trusted, a("10.0.0.1")},
		{"invalid peer", netip.Addr{}, []string{"198.51.100.7"}, trusted, netip.Addr{}},
		{"hop bound", a("10.0.0.1"), []string{"198.51.100.7," + strings.Repeat("10.9.9.9,", MaxForwardedHops+5) + "10.1.1.1"}, trusted, a("10.9.9.9")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ClientIP(tc.peer, tc.xff, tc.trusted); got != tc.want {
				t.Fatalf("ClientIP() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParsePrefixes(t *testing.T) {
	ps, err := ParsePrefixes([]string{"10.1.2.3/8", " 192.0.2.1 ", "2001:db8::/32", "::ffff:10.0.0.0/104"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32", "10.0.0.0/8"}
	for i, p := range ps {
		if p.String() != want[i] {
			t.Errorf("prefix %d = %s, want %s", i, p, want[i])
		}
	}
	if _, err := ParsePrefixes([]string{"10.0.0.0/33"}); err == nil {
		t.Error("ParsePrefixes accepted /33")
	}
	if Contains(ps, netip.Addr{}) {
		t.Error("Contains accepted the invalid address")
	}
}
