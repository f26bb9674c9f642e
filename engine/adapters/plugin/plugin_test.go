package plugin_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	_ "github.com/proxypool/proxypool/engine/adapters/plugin/expr" // the yaml kind
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// testKind is a plugin kind whose file content selects a behaviour, so the
// host's guard can be tested against misbehaving adapters of any kind.
const testKind = "testkind"

func init() {
	plugin.RegisterKind(testKind, func(name string, data []byte) (upstream.Adapter, error) {
		switch mode := strings.TrimSpace(string(data)); mode {
		case "panic-load":
			panic("loader exploded")
		case "error":
			return nil, errors.New("cannot compile")
		case "nil":
			return nil, nil
		default:
			return &fakeAdapter{mode: mode}, nil
		}
	})
}

type fakeAdapter struct{ mode string }

func (f *fakeAdapter) BuildRequest(ctx context.Context, in upstream.BuildInput) (upstream.Request, error) {
	switch f.mode {
	case "panic":
		panic("build exploded")
	case "crlf":
		return upstream.Request{Method: "GET", URL: "http://v.example/", Headers: map[string]string{"X-Key": "a\r\nInjected: 1"}}, nil
	}
	return upstream.Request{Method: "GET", URL: "http://v.example/" + f.mode}, nil
}

func (f *fakeAdapter) ParseResponse(ctx context.Context, resp upstream.Response, now time.Time) (upstream.ParseResult, error) {
	ok := proxy.Candidate{Scheme: proxy.SchemeHTTP, Host: "10.0.0.1", Port: 80}
	switch f.mode {
	case "panic":
		panic("parse exploded")
	case "bad-candidate":
		bad := ok
		bad.Host = "10.0.0.1 80"
		return upstream.ParseResult{Proxies: []proxy.Candidate{ok, bad}}, nil
	case "too-many":
		return upstream.ParseResult{Proxies: make([]proxy.Candidate, plugin.MaxProxies+1)}, nil
	case "retry":
		return upstream.ParseResult{RetryAfter: 48 * time.Hour}, &plugin.StatusError{Status: 429, RetryAfter: 48 * time.Hour}
	}
	return upstream.ParseResult{Proxies: []proxy.Candidate{ok}}, nil
}

func TestRegisterKindPanics(t *testing.T) {
	loader := func(string, []byte) (upstream.Adapter, error) { return nil, nil }
	cases := []struct {
		name string
		ext  string
		fn   plugin.KindLoader
	}{
		{"duplicate", testKind, loader},
		{"duplicate yaml", "yaml", loader},
		{"leading dot", ".wasm", loader},
		{"upper case", "WASM", loader},
		{"empty", "", loader},
		{"nil loader", "fresh", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("RegisterKind did not panic")
				}
			}()
			plugin.RegisterKind(tc.ext, tc.fn)
		})
	}
	if got := strings.Join(plugin.Kinds(), ","); got != "testkind,yaml" {
		t.Fatalf("Kinds() = %s", got)
	}
}

// template is a minimal valid expr template named name.
func template(name, path string) string {
	return fmt.Sprintf("abi: 1\nname: %s\nrequest:\n  url: '\"http://v.example/%s\"'\nresponse:\n  format: json\n  proxies: 'body'\n", name, path)
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"good.yaml":        template("good", "v1"),
		"other.testkind":   "ok",
		"broken.yaml":      strings.Replace(template("broken", "v1"), "abi: 1", "abi: 9", 1),
		"misnamed.yaml":    template("something-else", "v1"),
		"Upper.yaml":       template("Upper", "v1"),
		"twice.yaml":       template("twice", "v1"),
		"twice.testkind":   "ok",
		"boom.testkind":    "panic-load",
		"refused.testkind": "error",
		"empty.testkind":   "nil",
		"big.testkind":     strings.Repeat("x", plugin.MaxFileBytes+1),
		"README.md":        "# not a plugin",
		".hidden.yaml":     "not even yaml: [",
		"notes.txt":        "ignored",
		"good.yaml~":       "editor backup, ignored",
	})
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := plugin.Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(res.Set.Names(), ","); got != "good,other" {
		t.Fatalf("Names() = %s, want good,other", got)
	}
	wantErrs := map[string]string{
		"broken":   "plugin broken (broken.yaml): abi: 9 is not supported",
		"misnamed": `must equal the file name "misnamed"`,
		"Upper":    `invalid plugin name "Upper"`,
		"twice":    "defined by several files: twice.testkind, twice.yaml",
		"boom":     "loader panicked: loader exploded",
		"refused":  "plugin refused (refused.testkind): cannot compile",
		"empty":    "loader returned no adapter",
		"big":      fmt.Sprintf("larger than %d bytes", plugin.MaxFileBytes),
	}
	if len(res.Errors) != len(wantErrs) {
		t.Errorf("Errors has %d entries, want %d: %v", len(res.Errors), len(wantErrs), res.Err())
	}
	for name, want := range wantErrs {
		err := res.Errors[name]
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Errors[%s] = %v, want %q", name, err, want)
		}
	}
	if err := res.Err(); err == nil || !strings.HasPrefix(err.Error(), "plugin Upper") {
		t.Errorf("Err() must list every error sorted by name: %v", err)
	}

	data, _ := os.ReadFile(filepath.Join(dir, "good.yaml"))
	sum := sha256.Sum256(data)
	if d, ok := res.Set.Digest("good"); !ok || d != hex.EncodeToString(sum[:]) {
		t.Fatalf("Digest(good) = %s, %v", d, ok)
	}
	if k, ok := res.Set.Kind("other"); !ok || k != testKind {
		t.Fatalf("Kind(other) = %s, %v", k, ok)
	}
	if _, ok := res.Set.Digest("broken"); ok {
		t.Fatal("a broken plugin has a digest")
	}
	if _, err := res.Set.Adapter("broken"); !errors.Is(err, plugin.ErrUnknownPlugin) {
		t.Fatalf("Adapter(broken) = %v, want ErrUnknownPlugin", err)
	}
	a, err := res.Set.Adapter("good")
	if err != nil {
		t.Fatal(err)
	}
	req, err := a.BuildRequest(context.Background(), upstream.BuildInput{})
	if err != nil || req.URL != "http://v.example/v1" {
		t.Fatalf("BuildRequest = %+v, %v", req, err)
	}
}

func TestLoadDirectoryErrors(t *testing.T) {
	if _, err := plugin.Load(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("Load of a missing directory succeeded")
	}
	dir := t.TempDir()
	for i := 0; i <= plugin.MaxPlugins; i++ {
		writeFiles(t, dir, map[string]string{fmt.Sprintf("p%04d.testkind", i): "ok"})
	}
	_, err := plugin.Load(dir)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d plugin files", plugin.MaxPlugins)) {
		t.Fatalf("err = %v, want the plugin count bound", err)
	}
	if err := os.Remove(filepath.Join(dir, "p0000.testkind")); err != nil {
		t.Fatal(err)
	}
	res, err := plugin.Load(dir)
	if err != nil || res.Set.Len() != plugin.MaxPlugins {
		t.Fatalf("exactly MaxPlugins must load: %d, %v", res.Set.Len(), err)
	}
}

func TestMergeKeepsPreviousVersionOfBrokenPlugins(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"edited.yaml":  template("edited", "v1"),
		"broken.yaml":  template("broken", "v1"),
		"removed.yaml": template("removed", "v1"),
		"same.yaml":    template("same", "v1"),
	})
	first, err := plugin.Load(dir)
	if err != nil || first.Err() != nil {
		t.Fatalf("first load: %v %v", err, first.Err())
	}
	gen1 := plugin.Merge(nil, first)

	writeFiles(t, dir, map[string]string{
		"edited.yaml": template("edited", "v2"),
		"broken.yaml": "abi: 1\nname: broken\nrequest: {url: 'nope('}\n",
		"added.yaml":  template("added", "v1"),
	})
	if err := os.Remove(filepath.Join(dir, "removed.yaml")); err != nil {
		t.Fatal(err)
	}
	second, err := plugin.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if second.Errors["broken"] == nil {
		t.Fatal("the broken edit must be reported")
	}
	gen2 := plugin.Merge(gen1, second)

	if got := strings.Join(gen2.Names(), ","); got != "added,broken,edited,same" {
		t.Fatalf("Names() = %s", got)
	}
	digest := func(s *plugin.Set, n string) string { d, _ := s.Digest(n); return d }
	if digest(gen2, "broken") != digest(gen1, "broken") {
		t.Fatal("a broken plugin must keep its previous version")
	}
	if digest(gen2, "edited") == digest(gen1, "edited") {
		t.Fatal("an edited plugin must be replaced")
	}
	if digest(gen2, "same") != digest(gen1, "same") {
		t.Fatal("an unchanged plugin must keep its digest")
	}
	url := func(n string) string {
		a, err := gen2.Adapter(n)
		if err != nil {
			t.Fatal(err)
		}
		r, err := a.BuildRequest(context.Background(), upstream.BuildInput{})
		if err != nil {
			t.Fatal(err)
		}
		return r.URL
	}
	if url("broken") != "http://v.example/v1" || url("edited") != "http://v.example/v2" {
		t.Fatalf("broken → %s, edited → %s", url("broken"), url("edited"))
	}
	if gen1.Len() != 4 {
		t.Fatal("Merge must not modify the previous generation")
	}
	if fresh := plugin.Merge(nil, second); fresh.Len() != 3 {
		t.Fatalf("without a previous generation a broken plugin is absent: %v", fresh.Names())
	}
}

func TestGuard(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"panics.testkind":  "panic",
		"badcand.testkind": "bad-candidate",
		"toomany.testkind": "too-many",
		"crlf.testkind":    "crlf",
		"retry.testkind":   "retry",
		"fine.testkind":    "ok",
	})
	res, err := plugin.Load(dir)
	if err != nil || res.Err() != nil {
		t.Fatalf("Load: %v %v", err, res.Err())
	}
	get := func(n string) upstream.Adapter {
		a, err := res.Set.Adapter(n)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	ctx := context.Background()
	now := time.Unix(0, 0)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	if _, err := get("panics").BuildRequest(ctx, upstream.BuildInput{}); err == nil || !strings.Contains(err.Error(), "plugin panics: building request: adapter panicked") {
		t.Errorf("BuildRequest panic: %v", err)
	}
	if _, err := get("panics").ParseResponse(ctx, upstream.Response{}, now); err == nil || !strings.Contains(err.Error(), "adapter panicked") {
		t.Errorf("ParseResponse panic: %v", err)
	}
	if _, err := get("crlf").BuildRequest(ctx, upstream.BuildInput{}); err == nil || !strings.Contains(err.Error(), "control character") {
		t.Errorf("header injection: %v", err)
	}
	if r, err := get("badcand").ParseResponse(ctx, upstream.Response{}, now); err == nil || !strings.Contains(err.Error(), "proxy 1:") || len(r.Proxies) != 0 {
		t.Errorf("bad candidate: %v, %d proxies", err, len(r.Proxies))
	}
	if _, err := get("toomany").ParseResponse(ctx, upstream.Response{}, now); err == nil || !strings.Contains(err.Error(), "more than 10000") {
		t.Errorf("too many: %v", err)
	}
	r, err := get("retry").ParseResponse(ctx, upstream.Response{}, now)
	var se *plugin.StatusError
	if !errors.As(err, &se) || r.RetryAfter != plugin.MaxRetryAfter {
		t.Errorf("retry: %v, RetryAfter %s", err, r.RetryAfter)
	}
	if _, err := get("fine").ParseResponse(cancelled, upstream.Response{}, now); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled parse: %v", err)
	}
	if _, err := get("fine").BuildRequest(cancelled, upstream.BuildInput{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled build: %v", err)
	}
	if r, err := get("fine").ParseResponse(ctx, upstream.Response{}, now); err != nil || len(r.Proxies) != 1 {
		t.Errorf("fine: %v", err)
	}
}

func TestLoadFileAndDescribe(t *testing.T) {
	set, err := plugin.LoadFile("../../../plugins/json-envelope.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, ok := set.Describe("json-envelope")
	if !ok || len(d.Params) == 0 || d.Secrets[0] != "apiKey" || d.Text == "" {
		t.Fatalf("Describe = %+v, %v", d, ok)
	}
	if _, err := plugin.LoadFile("../../../plugins/README.md"); err == nil {
		t.Fatal("LoadFile of a README succeeded")
	}
	var empty *plugin.Set
	if empty.Len() != 0 || empty.Names() != nil {
		t.Fatal("a nil set must be empty")
	}
	if _, err := empty.Adapter("x"); !errors.Is(err, plugin.ErrUnknownPlugin) {
		t.Fatal(err)
	}
}

func TestCheckHost(t *testing.T) {
	cases := []struct {
		host string
		ok   bool
	}{
		{"203.0.113.7", true},
		{"2001:db8::1", true},
		{"::ffff:10.0.0.1", true},
		{"proxy-1.vendor.example", true},
		{"under_score.example", true},
		{"localhost", true},
		{"", false},
		{"[2001:db8::1]", false},
		{"fe80::1%eth0", false},
		{"http://h.example", false},
		{"h.example:80", false},
		{"h .example", false},
		{"h.example.", false},
		{"-h.example", false},
		{"h..example", false},
		{"127.1", false},
		{"2130706433", false},
		{"0x7f000001", false},
		{"1.2.3.4.5", false},
		{"256.1.1.1", false},
		{strings.Repeat("a", 64) + ".example", false},
		{strings.Repeat("a.", 127) + "aa", false},
	}
	for _, tc := range cases {
		t.Run(tc.host, func(t *testing.T) {
			if err := plugin.CheckHost(tc.host); (err == nil) != tc.ok {
				t.Fatalf("CheckHost(%q) = %v, want ok=%v", tc.host, err, tc.ok)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 120 ", 2 * time.Minute, true},
		{"99999999999999999999", 0, false},
		{"86400", plugin.MaxRetryAfter, true},
		{"-5", 0, false},
		{"Thu, 01 Jan 2026 00:00:30 GMT", 30 * time.Second, true},
		{"Wed, 31 Dec 2025 23:00:00 GMT", 0, true},
		{"Fri, 02 Jan 2026 00:00:00 GMT", plugin.MaxRetryAfter, true},
		{"later", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := plugin.ParseRetryAfter(tc.in, now)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("ParseRetryAfter(%q) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestCheckRequest(t *testing.T) {
	ok := upstream.Request{Method: "GET", URL: "https://v.example/p?key=x"}
	cases := []struct {
		name    string
		mutate  func(r *upstream.Request)
		wantErr string
	}{
		{"ok", func(r *upstream.Request) {}, ""},
		{"lowercase method", func(r *upstream.Request) { r.Method = "get" }, "invalid method"},
		{"ftp url", func(r *upstream.Request) { r.URL = "ftp://v.example/" }, "want http or https"},
		{"relative url", func(r *upstream.Request) { r.URL = "/p" }, "want http or https"},
		{"no host", func(r *upstream.Request) { r.URL = "http:///p" }, "no host"},
		{"control char in url", func(r *upstream.Request) { r.URL = "http://v.example/\nkey=SECRET" }, "invalid url"},
		{"header injection", func(r *upstream.Request) { r.Headers = map[string]string{"X": "a\r\nB: c"} }, "control character"},
		{"bad header name", func(r *upstream.Request) { r.Headers = map[string]string{"X Y": "a"} }, "invalid header name"},
		{"host header", func(r *upstream.Request) { r.Headers = map[string]string{"host": "evil"} }, "set by the host"},
		{"huge body", func(r *upstream.Request) { r.Body = make([]byte, plugin.MaxRequestBodyBytes+1) }, "body longer"},
		{"huge url", func(r *upstream.Request) { r.URL = "http://v.example/" + strings.Repeat("a", plugin.MaxURLBytes) }, "url longer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mutate(&r)
			err := plugin.CheckRequest(r)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("error echoes the url: %v", err)
			}
		})
	}
}
