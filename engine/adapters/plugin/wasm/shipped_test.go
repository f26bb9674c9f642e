package wasm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/adapters/plugin/wasm"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/testenv"
)

// The shipped WASM adapters (plugins/src/*), run through the plugin host
// as production runs them: loaded by the "wasm" kind, wrapped in the guard.
// The recorded responses are the expr kind's fixtures of the same shapes,
// copied, and must give the same candidates (the golden files too are the
// expr kind's).

var update = flag.Bool("update", false, "rewrite golden files")

var fetchTime = time.Date(2026, 11, 29, 22, 51, 3, 0, time.UTC)

// loadShipped loads a shipped adapter through plugin.LoadFile, i.e. the
// registered "wasm" kind and the host guard.
func loadShipped(t testing.TB, name string) upstream.Adapter {
	t.Helper()
	keep(t, name)
	dir := t.TempDir()
	path := filepath.Join(dir, name+".wasm")
	if err := os.WriteFile(path, guestBytes(t, name), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := plugin.LoadFile(path)
	if err != nil {
		t.Fatalf("loading shipped %s: %v", name, err)
	}
	a, err := set.Adapter(name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type fixture struct {
	file    string
	status  int
	headers map[string]string
	params  map[string]string
	wantN   int
	wantErr string
	errType any
}

var shippedFixtures = map[string][]fixture{
	"json-list-wasm": {
		{file: "ok.json", status: 200, wantN: 3},
		{file: "empty.json", status: 200},
		{file: "bad-port.json", status: 200, wantErr: "proxy 0: field port", errType: new(*wasm.GuestError)},
		{file: "url-host.json", status: 200, wantErr: "proxy 0: field host", errType: new(*wasm.EntryError)},
		{file: "envelope.json", status: 200, wantErr: "not a json array", errType: new(*plugin.VendorError)},
		{file: "server-error.json", status: 500, wantErr: "unexpected http status 500", errType: new(*plugin.StatusError)},
		{file: "server-error.json", status: 200, wantErr: "decoding json body", errType: new(*wasm.GuestError)},
		{file: "empty.json", status: 429, headers: map[string]string{"Retry-After": "2"}, wantErr: "status 429", errType: new(*plugin.StatusError)},
	},
	"ip-port-user-pass": {
		{file: "ok.txt", status: 200, params: map[string]string{"ttl": "300"}, wantN: 3},
		{file: "empty.txt", status: 200},
		{file: "crlf-bom.txt", status: 200, wantN: 2},
		{file: "malformed.txt", status: 200, wantErr: "line 1: want host:port or host:port:user:pass", errType: new(*wasm.GuestError)},
		{file: "bad-host.txt", status: 200, wantErr: "proxy 1: field host", errType: new(*wasm.EntryError)},
		{file: "ok.txt", status: 200, params: map[string]string{"ttl": "soon"}, wantErr: "param ttl", errType: new(*wasm.GuestError)},
		{file: "ok.txt", status: 401, wantErr: "unexpected http status 401", errType: new(*plugin.StatusError)},
	},
}

func TestShippedFixtures(t *testing.T) {
	t.Parallel()
	for name, fixtures := range shippedFixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := loadShipped(t, name)
			for _, f := range fixtures {
				t.Run(fmt.Sprintf("%s/%d", f.file, f.status), func(t *testing.T) {
					body, err := os.ReadFile(filepath.Join("testdata", "responses", name, f.file))
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
					checkGolden(t, filepath.Join("testdata", "golden", name, strings.TrimSuffix(f.file, filepath.Ext(f.file))+".golden.json"), res)
				})
			}
			t.Run("retry after", func(t *testing.T) {
				res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 429, Headers: map[string]string{"Retry-After": "2"}}, fetchTime)
				var se *plugin.StatusError
				if !errors.As(err, &se) || se.RetryAfter != 2*time.Second || res.RetryAfter != 2*time.Second {
					t.Fatalf("res = %+v, err = %v; want a 2s back-off", res, err)
				}
			})
		})
	}
}

// golden is the stable rendering of a ParseResult, as the expr kind's
// tests write it.
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

func TestShippedDescriptions(t *testing.T) {
	t.Parallel()
	cases := map[string]plugin.Description{
		"json-list-wasm": {Text: `[{"ip","port","user","pass","ttl"}]`, Params: []plugin.Param{
			{Name: "url", Required: true}, {Name: "countParam", Default: "num"}, {Name: "scheme", Default: "http"},
		}, Secrets: []string{"apiKey"}},
		"ip-port-user-pass": {Text: "ip:port:user:pass per line", Params: []plugin.Param{
			{Name: "url", Required: true}, {Name: "countParam", Default: "count"}, {Name: "format", Default: "text"},
			{Name: "ttl", Default: "0"}, {Name: "scheme", Default: "http"},
		}, Secrets: []string{"apiKey"}},
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			got := shared(t, name).Describe()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("Describe() = %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestShippedAgainstVendors runs each adapter against a loopback vendor:
// the request it builds must be one the vendor accepts, and the live
// answer must parse. ip-port-user-pass talks to testenv's simulated vendor
// (text format); json-list-wasm to a small server of the JSON-array shape,
// which testenv does not serve.
func TestShippedAgainstVendors(t *testing.T) {
	t.Parallel()
	const key = "k3y&/=x"
	client := &http.Client{Timeout: 10 * time.Second}

	t.Run("ip-port-user-pass", func(t *testing.T) {
		v, err := testenv.NewVendor(testenv.VendorConfig{Proxies: []testenv.VendorProxy{
			{Host: "203.0.113.10", Port: 8001, Username: "user1", Password: "pa:ss1"},
			{Host: "203.0.113.11", Port: 8002},
			{Host: "2001:db8::1", Port: 8003, Username: "u3", Password: "p3"},
		}, TTL: 10 * time.Minute, APIKey: key})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = v.Close() })
		a := loadShipped(t, "ip-port-user-pass")
		params := map[string]string{"url": v.URL() + "/v1/proxies", "ttl": "300"}
		req, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: params, Secrets: map[string]string{"apiKey": key}, Count: 3, Now: fetchTime})
		if err != nil {
			t.Fatal(err)
		}
		resp := do(t, client, req)
		resp.Params = params
		res, err := a.ParseResponse(context.Background(), resp, fetchTime)
		if err != nil {
			t.Fatalf("ParseResponse (status %d): %v", resp.Status, err)
		}
		checkProxies(t, res, []string{"http 2001:db8::1 8003 u3 p3 5m0s", "http 203.0.113.10 8001 user1 pa:ss1 5m0s", "http 203.0.113.11 8002   5m0s"})

		v.SetMode(testenv.VendorAuthRequired)
		req, err = a.BuildRequest(context.Background(), upstream.BuildInput{Params: params, Count: 3, Now: fetchTime})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.ParseResponse(context.Background(), do(t, client, req), fetchTime); !errors.As(err, new(*plugin.StatusError)) {
			t.Fatalf("without the key: err = %v, want a StatusError", err)
		}
	})

	t.Run("json-list-wasm", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Api-Key") != key || r.URL.Query().Get("n") != "2" || r.Header.Get("Accept") != "application/json" {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			_, _ = io.WriteString(w, `[{"ip":"203.0.113.20","port":9001,"user":"alice","pass":"s3cret","ttl":300,"extra":true},
				{"ip":"203.0.113.21","port":"9002","ttl":"60"}]`)
		}))
		t.Cleanup(srv.Close)
		a := loadShipped(t, "json-list-wasm")
		params := map[string]string{"url": srv.URL + "/list?x=1", "countParam": "n", "scheme": "socks5"}
		req, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: params, Secrets: map[string]string{"apiKey": key}, Count: 2, Now: fetchTime})
		if err != nil {
			t.Fatal(err)
		}
		resp := do(t, client, req)
		resp.Params = params
		res, err := a.ParseResponse(context.Background(), resp, fetchTime)
		if err != nil {
			t.Fatalf("ParseResponse (status %d): %v", resp.Status, err)
		}
		checkProxies(t, res, []string{"socks5 203.0.113.20 9001 alice s3cret 5m0s", "socks5 203.0.113.21 9002   1m0s"})
	})
}

func checkProxies(t *testing.T, res upstream.ParseResult, want []string) {
	t.Helper()
	got := make([]string, 0, len(res.Proxies))
	for _, c := range res.Proxies {
		got = append(got, fmt.Sprintf("%s %s %d %s %s %s", c.Scheme, c.Host, c.Port, c.Username, c.Password, c.TTL))
	}
	sort.Strings(got)
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("proxies = %q\nwant %q", got, want)
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

// TestPluginsDirectory loads a plugins directory holding WASM modules, as
// the controller does at start and on reload: a module larger than the
// template bound loads, and a broken edit keeps the previous version.
func TestPluginsDirectory(t *testing.T) {
	t.Parallel()
	keep(t, "json-list-wasm")
	keep(t, "rawabi")
	dir := t.TempDir()
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	good := guestBytes(t, "json-list-wasm")
	if len(good) <= plugin.MaxFileBytes {
		t.Fatalf("module of %d bytes: the test needs one above the template bound", len(good))
	}
	write("json-list-wasm.wasm", good)
	write("README.md", []byte("not a plugin"))
	first, err := plugin.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Err(); err != nil {
		t.Fatal(err)
	}
	if got := first.Set.Names(); len(got) != 1 || got[0] != "json-list-wasm" {
		t.Fatalf("Names() = %v", got)
	}
	if k, _ := first.Set.Kind("json-list-wasm"); k != wasm.Kind {
		t.Fatalf("kind %q", k)
	}
	if d, ok := first.Set.Describe("json-list-wasm"); !ok || len(d.Params) != 3 {
		t.Fatalf("Describe = %+v, %v", d, ok)
	}

	// A broken edit, and a new plugin that does not implement the ABI.
	write("json-list-wasm.wasm", good[:len(good)/3])
	write("raw.wasm", guestBytes(t, "rawabi")) // loads: rawabi implements v1
	write("bad.wasm", []byte("\x00asm garbage"))
	next, err := plugin.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if next.Errors["json-list-wasm"] == nil || next.Errors["bad"] == nil || next.Errors["raw"] != nil {
		t.Fatalf("errors = %v", next.Errors)
	}
	merged := plugin.Merge(first.Set, next)
	if got := strings.Join(merged.Names(), ","); got != "json-list-wasm,raw" {
		t.Fatalf("merged names = %s", got)
	}
	a, err := merged.Adapter("json-list-wasm")
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Body: []byte(`[{"ip":"203.0.113.9","port":80}]`)}, fetchTime)
	if err != nil || len(res.Proxies) != 1 {
		t.Fatalf("previous version after a broken reload: %+v, %v", res, err)
	}
	if d1, _ := first.Set.Digest("json-list-wasm"); func() bool { d2, _ := merged.Digest("json-list-wasm"); return d1 != d2 }() {
		t.Fatal("merged set does not hold the previous version")
	}
}
