package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadGoodMinimalAppliesDefaults(t *testing.T) {
	c, err := Load("testdata/good-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	u := c.Upstreams[0]
	if u.Fetch.RequestInterval != DefaultRequestInterval || u.Pool.MaxConcurrency != DefaultMaxConcurrency {
		t.Fatalf("defaults not applied: %+v", u)
	}
	if len(c.Routings) != 1 || c.Routings[0].Name != "default" || c.Routings[0].OnUnavailable != "reject" {
		t.Fatalf("want a default catch-all routing that rejects when unavailable, got %+v", c.Routings)
	}
	if !c.StrictMode() || c.Storage.Mode != "embedded" {
		t.Fatal("strict mode and embedded storage are the defaults")
	}
}

func TestUnknownFieldsNameTheirLines(t *testing.T) {
	_, err := Load("testdata/bad-unknown-field.yaml")
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("want Errors, got %v", err)
	}
	text := err.Error()
	for _, want := range []string{"line 3", "gatway", "line 8", "paramz"} {
		if !strings.Contains(text, want) {
			t.Errorf("error does not mention %q:\n%s", want, text)
		}
	}
	if len(errs) != 2 {
		t.Errorf("want both unknown fields reported, got %d: %v", len(errs), errs)
	}
	// Decoding problems do not hide validation problems in the same file.
	_, err = Parse([]byte("listeners: {gateway: 127.0.0.1:1, gatway: x}\nlog: {level: loud}\n"))
	if !strings.Contains(err.Error(), "gatway") || !strings.Contains(err.Error(), "log.level") {
		t.Fatalf("want the unknown field and the validation error together: %v", err)
	}
}

func TestValidationReportsEveryErrorWithPath(t *testing.T) {
	_, err := Load("testdata/bad-many.yaml")
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("want Errors, got %v", err)
	}
	paths := map[string]bool{}
	for _, e := range errs {
		paths[e.Path] = true
	}
	for _, want := range []string{
		"listeners.admin",
		"log.level",
		"storage.mode",
		"gateway.auth",
		"listeners.gateway", // strict mode: 0.0.0.0 with auth none... auth is usernamePassword here but has no users
		"upstreams[0].provider.plugin",
		"upstreams[0].fetch.requestInterval",
		"upstreams[0].fetch.maxResponseBytes",
		"upstreams[0].pool.target",
		"upstreams[0].pool.maxSize",
		"upstreams[1].name",
		"upstreams[1].provider.secrets.apiKey",
		"routings[0].upstreams[1]",
		"routings[0].onUnavailable",
		"routings[0].match.hosts[0]",
		"routings[0].match.ports[0]",
		"checker.maxPerSecond",
	} {
		if want == "listeners.gateway" {
			continue // auth mode is set, so strict mode does not apply
		}
		if !paths[want] {
			t.Errorf("missing error for %s; got:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatal("a literal secret leaked into the error text")
	}
}

func TestStrictModeRefusesOpenProxy(t *testing.T) {
	base := "listeners:\n  gateway: %s\n%s"
	cases := []struct {
		name, addr, extra string
		ok                bool
	}{
		{"loopback", "127.0.0.1:8080", "", true},
		{"localhost", "localhost:8080", "", true},
		{"all interfaces", "0.0.0.0:8080", "", false},
		{"empty host", ":8080", "", false},
		{"allow list", "0.0.0.0:8080", "gateway: {access: {allowCIDRs: [10.0.0.0/8]}}\n", true},
		{"strict off", "0.0.0.0:8080", "strict: false\n", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(fmt.Sprintf(base, tc.addr, tc.extra)))
			if (err == nil) != tc.ok {
				t.Fatalf("ok=%v, err=%v", tc.ok, err)
			}
		})
	}
}

func TestSecretResolvesAndNeverPrints(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	if err := os.WriteFile(path, []byte("s3cr3t-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PROXYPOOL_TEST_SECRET", "s3cr3t-env")
	yml := fmt.Sprintf(`listeners: {gateway: 127.0.0.1:1}
upstreams:
  - name: a
    provider:
      plugin: p
      secrets: {fromEnv: "env:PROXYPOOL_TEST_SECRET", fromFile: "file:%s"}
`, path)
	c, err := Parse([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Upstreams[0].Provider.Secrets
	if s["fromEnv"].Value() != "s3cr3t-env" || s["fromFile"].Value() != "s3cr3t-file" {
		t.Fatalf("resolved %q %q", s["fromEnv"].Value(), s["fromFile"].Value())
	}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "secret", s["fromEnv"], "all", c.Upstreams[0].Provider)
	out := fmt.Sprintf("%v %+v %#v %s", s["fromEnv"], c.Upstreams[0].Provider, s["fromFile"], logged.String())
	if strings.Contains(out, "s3cr3t") {
		t.Fatalf("secret value printed: %s", out)
	}
}

func TestSecretErrors(t *testing.T) {
	_, err := Load("testdata/bad-secret-missing.yaml")
	if err == nil || !strings.Contains(err.Error(), "PROXYPOOL_TEST_SURELY_UNSET_VAR is not set") {
		t.Fatalf("want a missing env var error, got %v", err)
	}
	for _, ref := range []string{"plain", "vault:x", "env:", "file:"} {
		if _, err := ParseSecretRef(ref); err == nil {
			t.Errorf("ParseSecretRef(%q) accepted", ref)
		}
	}
}

func TestSyntaxErrorsAndEdgeFiles(t *testing.T) {
	if _, err := Load("testdata/bad-syntax.yaml"); err == nil || !strings.Contains(err.Error(), "line") {
		t.Fatalf("want a syntax error with its line, got %v", err)
	}
	if _, err := Parse(nil); err == nil {
		t.Fatal("empty config accepted")
	}
	if _, err := Parse([]byte("listeners: {gateway: 127.0.0.1:1}\n---\nx: 1\n")); err == nil {
		t.Fatal("two documents accepted")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversize file: %v", err)
	}
}

func TestCheckSettings(t *testing.T) {
	const base = "listeners: {gateway: 127.0.0.1:8080}\nupstreams:\n  - name: a\n    provider: {plugin: p}\n"
	good := base + `    check: {probeTarget: "example.com:443", egressURL: "https://echo.example/ip", anonymity: elite}
routings:
  - name: shop
    upstreams: [a]
    check: {url: "https://shop.example/health"}
`
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Upstreams[0].Check
	if k.ProbeTarget != "example.com:443" || k.EgressURL != "https://echo.example/ip" || k.Anonymity != "elite" {
		t.Fatalf("check = %+v", k)
	}
	rc := c.Routings[0].Check
	if rc == nil || rc.ExpectStatus != DefaultTargetStatus || rc.Interval != DefaultCheckInterval {
		t.Fatalf("routing check defaults not applied: %+v", rc)
	}
	if c2, _ := Parse([]byte(base)); c2.Upstreams[0].Check.Anonymity != DefaultAnonymity || c2.Routings[0].Check != nil {
		t.Fatalf("defaults without the new fields: %+v", c2.Upstreams[0].Check)
	}

	bad := base + `    check: {probeTarget: "no-port", egressURL: "ftp://echo.example/", anonymity: invisible}
routings:
  - name: shop
    upstreams: [a]
    check: {expectStatus: 700, interval: -1s}
  - name: other
    upstreams: [a]
    check: {url: "http://user:pw@x.example/"}
`
	_, err = Parse([]byte(bad))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("want Errors, got %v", err)
	}
	paths := map[string]bool{}
	for _, e := range errs {
		paths[e.Path] = true
	}
	for _, want := range []string{
		"upstreams[0].check.probeTarget", "upstreams[0].check.egressURL", "upstreams[0].check.anonymity",
		"routings[0].check.url", "routings[0].check.expectStatus", "routings[0].check.interval",
		"routings[1].check.url",
	} {
		if !paths[want] {
			t.Errorf("no error for %s in %v", want, errs)
		}
	}
}

// The shipped samples must always be valid: the packaged one as is, the
// demo with its opt-ins.
func TestShippedSamplesAreValid(t *testing.T) {
	for _, f := range []string{"../../etc/proxypool/proxypool.yaml", "../../etc/proxypool/demo.yaml"} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Setenv("PROXYPOOL_VENDOR_KEY", "test")
			c, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(f) == "proxypool.yaml" && (c.Demo != nil || c.Security.AllowLoopbackDestinations) {
				t.Fatal("the packaged sample must not carry demo settings")
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, p := range []string{"testdata/good-minimal.yaml", "testdata/bad-many.yaml", "testdata/bad-unknown-field.yaml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err == nil && c == nil {
			t.Fatal("nil config without error")
		}
	})
}

func TestRoutingMaxInFlight(t *testing.T) {
	const base = "listeners: {gateway: 127.0.0.1:8080}\nupstreams:\n  - name: a\n    provider: {plugin: p}\nroutings:\n  - name: r\n    upstreams: [a]\n"
	c, err := Parse([]byte(base + "    maxInFlight: 50\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Routings[0].MaxInFlight != 50 {
		t.Fatalf("maxInFlight = %d", c.Routings[0].MaxInFlight)
	}
	if c, _ := Parse([]byte(base)); c.Routings[0].MaxInFlight != 0 {
		t.Fatalf("default maxInFlight = %d, want 0 (unbounded)", c.Routings[0].MaxInFlight)
	}
	_, err = Parse([]byte(base + "    maxInFlight: -1\n"))
	if err == nil || !strings.Contains(err.Error(), "routings[0].maxInFlight") {
		t.Fatalf("negative maxInFlight: %v", err)
	}
}
