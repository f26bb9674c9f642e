package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func cli(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = runCLI(args, &o, &e)
	return code, o.String(), e.String()
}

func TestConfigCheck(t *testing.T) {
	t.Setenv("PROXYPOOL_VENDOR_KEY", "x")
	code, out, errOut := cli("config", "check", "../../etc/proxypool/proxypool.yaml")
	if code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("packaged sample: %d %s %s", code, out, errOut)
	}
	code, _, errOut = cli("config", "check", "../../engine/config/testdata/bad-many.yaml")
	if code != 1 {
		t.Fatalf("bad config exit %d", code)
	}
	for _, want := range []string{"log.level", "storage.mode", "upstreams[0].pool.target", "routings[0].upstreams[1]"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("config check output lacks %s:\n%s", want, errOut)
		}
	}
	// A config naming a plugin that is not in the plugins dir fails too.
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("listeners: {gateway: 127.0.0.1:1}\npluginsDir: ../../plugins\nupstreams: [{name: a, provider: {plugin: nope}}, {name: b, provider: {plugin: json-envelope}}]\n"), 0o600)
	code, _, errOut = cli("config", "check", cfg)
	if code != 1 || !strings.Contains(errOut, `plugin "nope" not found`) || !strings.Contains(errOut, "upstreams[1].provider.params.url") {
		t.Fatalf("missing plugin / required param not reported: %d %s", code, errOut)
	}
	if code, _, _ := cli("config", "check"); code != 2 {
		t.Fatal("usage error must exit 2")
	}
}

func TestPluginListAndTest(t *testing.T) {
	code, out, errOut := cli("plugin", "list", "--dir", "../../plugins")
	if code != 0 || !strings.Contains(out, "json-envelope") || !strings.Contains(out, "text-lines") {
		t.Fatalf("plugin list: %d %s %s", code, out, errOut)
	}
	t.Setenv("CLI_TEST_KEY", "sekret-value")
	code, out, errOut = cli("plugin", "test", "json-envelope", "--dir", "../../plugins",
		"--param", "url=http://vendor.example/v1/proxies", "--secret", "apiKey=env:CLI_TEST_KEY",
		"--response", "testdata/vendor-envelope.json")
	if code != 0 {
		t.Fatalf("plugin test: %d %s %s", code, out, errOut)
	}
	for _, want := range []string{"GET http://vendor.example/v1/proxies", "parsed 2 proxies", "203.0.113.7", `"password": "REDACTED"`} {
		if !strings.Contains(out, want) {
			t.Errorf("plugin test output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "sekret-value") || strings.Contains(out, "pw1") {
		t.Fatalf("secret printed:\n%s", out)
	}
	code, out, _ = cli("plugin", "test", "json-envelope", "--dir", "../../plugins", "--param", "url=http://v.example/", "--response", "testdata/vendor-envelope.json", "--status", "500")
	if code != 1 || !strings.Contains(out, "parse: error") {
		t.Fatalf("a 500 must be reported as a parse error: %d %s", code, out)
	}
	if code, _, errOut := cli("plugin", "test", "no-such", "--dir", "../../plugins"); code != 1 || !strings.Contains(errOut, "no-such") {
		t.Fatalf("unknown plugin: %d %s", code, errOut)
	}
}

func TestVersionAndUsage(t *testing.T) {
	if code, out, _ := cli("version"); code != 0 || !strings.HasPrefix(out, "proxypool ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, _, _ := cli(); code != 2 {
		t.Fatal("no args must exit 2")
	}
	if code, _, errOut := cli("frobnicate"); code != 2 || !strings.Contains(errOut, "unknown command") {
		t.Fatal("unknown command must exit 2")
	}
}
