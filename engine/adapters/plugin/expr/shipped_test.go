package expr_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/adapters/plugin/expr"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/testenv"
)

var (
	update = flag.Bool("update", false, "rewrite golden files")
	record = flag.Bool("record", false, "re-record response fixtures from testenv's simulated vendor")
)

// pluginsDir is the repository's shipped plugins.
const pluginsDir = "../../../../plugins"

// fetchTime is the host's fetch time in fixture tests: the recorded expiry
// times are about ten minutes after it.
var fetchTime = time.Date(2026, 11, 29, 22, 51, 3, 0, time.UTC)

// shipped compiles one shipped template without the host guard, so tests
// and fuzzing see the adapter's own behaviour (a panic stays a panic).
func shipped(t testing.TB, name string) *expr.Adapter {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(pluginsDir, name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := expr.Compile(name, data)
	if err != nil {
		t.Fatalf("compiling shipped %s: %v", name, err)
	}
	return a
}

func TestShippedPluginsLoad(t *testing.T) {
	res, err := plugin.Load(pluginsDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("shipped plugins must all load: %v", err)
	}
	want := []string{"json-envelope", "json-list", "text-lines"}
	if got := res.Set.Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Names() = %v, want %v (README.md must be ignored)", got, want)
	}
}

// vendorProxies is what the simulated vendor hands out when recording.
var vendorProxies = []testenv.VendorProxy{
	{Host: "203.0.113.10", Port: 8001, Username: "user1", Password: "pa:ss1", Region: "cn-sh", Carrier: "ct"},
	{Host: "203.0.113.11", Port: 8002, Region: "cn-bj", Carrier: "cu"},
	{Host: "2001:db8::1", Port: 8003, Username: "u3", Password: "p3"},
}

// fixture is one recorded or hand-written response and what parsing it
// must give: a golden file of candidates, or an error.
type fixture struct {
	plugin  string
	file    string // under testdata/responses/<plugin>/
	status  int
	headers map[string]string
	params  map[string]string
	wantN   int    // expected candidates when wantErr is empty
	wantErr string // substring of the error
	errType any    // pointer to the typed error expected, for errors.As
}

var fixtures = []fixture{
	{plugin: "json-envelope", file: "ok.json", status: 200, wantN: 3},
	{plugin: "json-envelope", file: "empty.json", status: 200, wantN: 0},
	{plugin: "json-envelope", file: "malformed.json", status: 200, wantErr: "decoding json body"},
	{plugin: "json-envelope", file: "unauthorized.json", status: 401, wantErr: "unexpected http status 401", errType: new(*plugin.StatusError)},
	{plugin: "json-envelope", file: "rate-limited.json", status: 429, headers: map[string]string{"Retry-After": "2"}, wantErr: "status 429", errType: new(*plugin.StatusError)},
	{plugin: "json-envelope", file: "vendor-error.json", status: 200, wantErr: "code 10001: balance exhausted", errType: new(*plugin.VendorError)},
	{plugin: "json-envelope", file: "bad-port.json", status: 200, wantErr: "proxy 1: field port", errType: new(*expr.EntryError)},
	{plugin: "json-envelope", file: "bad-host.json", status: 200, wantErr: "proxy 0: field host", errType: new(*expr.EntryError)},
	{plugin: "json-envelope", file: "bad-expiry.json", status: 200, wantErr: "proxy 0: field expiresAt", errType: new(*expr.EntryError)},
	{plugin: "json-envelope", file: "not-object.json", status: 200, wantErr: "not a json object", errType: new(*plugin.VendorError)},
	{plugin: "json-list", file: "ok.json", status: 200, wantN: 3},
	{plugin: "json-list", file: "empty.json", status: 200, wantN: 0},
	{plugin: "json-list", file: "bad-port.json", status: 200, wantErr: "proxy 0: field port", errType: new(*expr.EntryError)},
	{plugin: "json-list", file: "url-host.json", status: 200, wantErr: "proxy 0: field host", errType: new(*expr.EntryError)},
	{plugin: "json-list", file: "envelope.json", status: 200, wantErr: "not a json array", errType: new(*plugin.VendorError)},
	{plugin: "json-list", file: "server-error.json", status: 500, wantErr: "unexpected http status 500", errType: new(*plugin.StatusError)},
	{plugin: "text-lines", file: "ok.txt", status: 200, params: map[string]string{"ttl": "300"}, wantN: 3},
	{plugin: "text-lines", file: "empty.txt", status: 200, wantN: 0},
	{plugin: "text-lines", file: "crlf-bom.txt", status: 200, wantN: 2},
	{plugin: "text-lines", file: "malformed.txt", status: 200, wantErr: "parseProxyLine"},
	{plugin: "text-lines", file: "bad-host.txt", status: 200, wantErr: "proxy 1: field host", errType: new(*expr.EntryError)},
}

func fixturePath(f fixture) string { return filepath.Join("testdata", "responses", f.plugin, f.file) }

func TestParseFixtures(t *testing.T) {
	adapters := map[string]*expr.Adapter{}
	for _, f := range fixtures {
		t.Run(f.plugin+"/"+f.file, func(t *testing.T) {
			a := adapters[f.plugin]
			if a == nil {
				a = shipped(t, f.plugin)
				adapters[f.plugin] = a
			}
			body, err := os.ReadFile(fixturePath(f))
			if err != nil {
				t.Fatal(err)
			}
			res, err := a.ParseResponse(context.Background(), upstream.Response{Status: f.status, Headers: f.headers, Body: body, Params: f.params}, fetchTime)
			if f.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), f.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, f.wantErr)
				}
				if f.errType != nil && !errors.As(err, f.errType) {
					t.Fatalf("err = %v (%T), want %T", err, err, f.errType)
				}
				if len(res.Proxies) != 0 {
					t.Fatalf("a failed parse returned %d proxies", len(res.Proxies))
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseResponse: %v", err)
			}
			if len(res.Proxies) != f.wantN {
				t.Fatalf("got %d proxies, want %d", len(res.Proxies), f.wantN)
			}
			for i := range res.Proxies {
				if err := plugin.CheckCandidate(&res.Proxies[i]); err != nil {
					t.Fatalf("proxy %d fails the host check: %v", i, err)
				}
			}
			checkGolden(t, filepath.Join("testdata", "golden", f.plugin, strings.TrimSuffix(f.file, filepath.Ext(f.file))+".golden.json"), res)
		})
	}
}

func TestRateLimitedRetryAfter(t *testing.T) {
	a := shipped(t, "json-envelope")
	cases := []struct {
		name   string
		status int
		header string
		want   time.Duration
	}{
		{"seconds", 429, "2", 2 * time.Second},
		{"http date", 429, fetchTime.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"capped", 429, "999999", plugin.MaxRetryAfter},
		{"absent", 429, "", 0},
		{"garbage", 429, "soon", 0},
		{"503 too", 503, "7", 7 * time.Second},
		{"500 ignores it", 500, "7", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{}
			if tc.header != "" {
				h["Retry-After"] = tc.header
			}
			res, err := a.ParseResponse(context.Background(), upstream.Response{Status: tc.status, Headers: h, Body: []byte(`{}`)}, fetchTime)
			var se *plugin.StatusError
			if !errors.As(err, &se) || se.Status != tc.status {
				t.Fatalf("err = %v, want a StatusError for %d", err, tc.status)
			}
			if res.RetryAfter != tc.want || se.RetryAfter != tc.want {
				t.Fatalf("RetryAfter = %s (error says %s), want %s", res.RetryAfter, se.RetryAfter, tc.want)
			}
		})
	}
}

// golden is the stable rendering of a ParseResult.
type golden struct {
	Scheme, Host string
	Port         uint16
	Username     string
	Password     string
	TTL          string
	ExpiresAt    string `json:",omitempty"`
	Region       string `json:",omitempty"`
	Carrier      string `json:",omitempty"`
	Tags         map[string]string
}

func checkGolden(t *testing.T, path string, res upstream.ParseResult) {
	t.Helper()
	out := make([]golden, 0, len(res.Proxies))
	for _, c := range res.Proxies {
		g := golden{Scheme: string(c.Scheme), Host: c.Host, Port: c.Port, Username: c.Username, Password: c.Password,
			TTL: c.TTL.String(), Region: c.Region, Carrier: c.Carrier, Tags: c.Tags}
		if !c.ExpiresAt.IsZero() {
			g.ExpiresAt = c.ExpiresAt.UTC().Format(time.RFC3339)
		}
		out = append(out, g)
	}
	got, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden (run with -update to create): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s mismatch (run with -update to accept)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestSimulatedVendor runs each template against testenv's vendor over
// loopback: the request the template builds must be one the vendor accepts
// (key escaped, count and format set), and the live answer must parse. With
// -record it also refreshes the recorded fixtures.
func TestSimulatedVendor(t *testing.T) {
	const key = "k3y&/=x"
	v, err := testenv.NewVendor(testenv.VendorConfig{Proxies: vendorProxies, TTL: 10 * time.Minute, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	client := &http.Client{Timeout: 10 * time.Second}

	cases := []struct {
		plugin string
		mode   testenv.VendorMode
		file   string // fixture to record
		params map[string]string
		wantN  int
		fails  bool
	}{
		{"json-envelope", testenv.VendorNormal, "ok.json", nil, 3, false},
		{"json-envelope", testenv.VendorEmpty, "empty.json", nil, 0, false},
		{"json-envelope", testenv.VendorMalformed, "malformed.json", nil, 0, true},
		{"json-envelope", testenv.VendorAuthRequired, "unauthorized.json", nil, 0, true},
		{"json-envelope", testenv.VendorRateLimited, "rate-limited.json", nil, 0, true},
		{"json-envelope", testenv.VendorError500, "", nil, 0, true},
		{"text-lines", testenv.VendorNormal, "ok.txt", map[string]string{"ttl": "300"}, 3, false},
		{"text-lines", testenv.VendorEmpty, "empty.txt", nil, 0, false},
		{"text-lines", testenv.VendorMalformed, "malformed.txt", nil, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.plugin+"/"+tc.mode.String(), func(t *testing.T) {
			a := shipped(t, tc.plugin)
			v.SetProxies(vendorProxies) // restart rotation: same batch every case
			v.SetMode(tc.mode)
			params := map[string]string{"url": v.URL() + "/v1/proxies"}
			for k, p := range tc.params {
				params[k] = p
			}
			ctx := context.Background()
			req, err := a.BuildRequest(ctx, upstream.BuildInput{Params: params, Secrets: map[string]string{"apiKey": key}, Count: 3, Now: fetchTime})
			if err != nil {
				t.Fatalf("BuildRequest: %v", err)
			}
			resp := do(t, client, req)
			if *record && tc.file != "" {
				path := filepath.Join("testdata", "responses", tc.plugin, tc.file)
				if err := os.WriteFile(path, resp.Body, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			resp.Params = params
			res, err := a.ParseResponse(ctx, resp, time.Now())
			if tc.fails {
				if err == nil {
					t.Fatalf("mode %s parsed without error: %+v", tc.mode, res)
				}
				if tc.mode == testenv.VendorRateLimited && res.RetryAfter != 2*time.Second {
					t.Fatalf("RetryAfter = %s, want 2s", res.RetryAfter)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseResponse (status %d): %v", resp.Status, err)
			}
			if len(res.Proxies) != tc.wantN {
				t.Fatalf("got %d proxies, want %d", len(res.Proxies), tc.wantN)
			}
			if tc.wantN > 0 {
				got := make([]string, 0, len(res.Proxies))
				for _, c := range res.Proxies {
					got = append(got, fmt.Sprintf("%s %s %d %s %s", c.Scheme, c.Host, c.Port, c.Username, c.Password))
				}
				sort.Strings(got)
				want := []string{"http 2001:db8::1 8003 u3 p3", "http 203.0.113.10 8001 user1 pa:ss1", "http 203.0.113.11 8002  "}
				if strings.Join(got, "|") != strings.Join(want, "|") {
					t.Fatalf("proxies = %q, want %q", got, want)
				}
			}
		})
	}
}

func do(t *testing.T, client *http.Client, r upstream.Request) upstream.Response {
	t.Helper()
	req, err := http.NewRequest(r.Method, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	for k, vs := range resp.Header {
		h[k] = vs[0]
	}
	return upstream.Response{Status: resp.StatusCode, Headers: h, Body: body}
}
