package wasm_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/adapters/plugin/wasm"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// The compatibility kit: the tck guest (testdata/guests/tck), written with
// the SDK, exercises every export of ABI v1 and every form of output, so
// these tests pin the SDK and the host to the same wire format.

var tckNow = time.Date(2026, 11, 29, 22, 51, 3, 123456789, time.UTC)

func TestTCKDescribe(t *testing.T) {
	t.Parallel()
	a := shared(t, "tck")
	want := plugin.Description{
		Text: "compatibility kit",
		Params: []plugin.Param{
			{Name: "a", Required: true},
			{Name: "b", Default: "dflt"},
			{Name: "mode", Default: "echo"},
		},
		Secrets: []string{"token", "other"},
	}
	if got := a.Describe(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Describe() = %+v, want %+v", got, want)
	}
}

// echo is the tck's request body: what the guest saw.
type echo struct {
	Params  map[string]string `json:"params"`
	Secrets map[string]string `json:"secrets"`
	Count   int               `json:"count"`
	Now     time.Time         `json:"now"`
	Clock   time.Time         `json:"clock"`
}

func TestTCKBuildRequest(t *testing.T) {
	t.Parallel()
	a := shared(t, "tck")
	ctx := context.Background()
	req, err := a.BuildRequest(ctx, upstream.BuildInput{
		Params:  map[string]string{"a": "x y&z"},
		Secrets: map[string]string{"token": "s3cr3t"},
		Count:   7,
		Now:     tckNow,
	})
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != "POST" || req.URL != "https://vendor.example/v1/echo?a=x+y%26z&count=7&x=1" {
		t.Fatalf("request = %s %s", req.Method, req.URL)
	}
	if want := map[string]string{"Content-Type": "application/json", "X-Params": "a=x y&z,b=dflt,mode=echo"}; !reflect.DeepEqual(req.Headers, want) {
		t.Fatalf("headers = %v, want %v", req.Headers, want)
	}
	var e echo
	if err := json.Unmarshal(req.Body, &e); err != nil {
		t.Fatalf("body %q: %v", req.Body, err)
	}
	want := echo{
		Params:  map[string]string{"a": "x y&z", "b": "dflt", "mode": "echo"},
		Secrets: map[string]string{"token": "s3cr3t", "other": ""},
		Count:   7,
		Now:     tckNow,
		Clock:   tckNow, // the guest's time.Now is the fetch time
	}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("guest saw %+v, want %+v", e, want)
	}
}

func TestTCKBuildRequestErrors(t *testing.T) {
	t.Parallel()
	a := shared(t, "tck")
	cases := []struct {
		name    string
		in      upstream.BuildInput
		wantErr string
		check   func(error) bool
	}{
		{"plugin error", upstream.BuildInput{Params: map[string]string{"a": "1", "mode": "error"}}, "plugin reported: plugin says no", isGuestError},
		{"vendor error", upstream.BuildInput{Params: map[string]string{"a": "1", "mode": "vendor"}}, "not at build time", isVendorError},
		{"panic is recovered", upstream.BuildInput{Params: map[string]string{"a": "1", "mode": "panic"}}, "plugin panicked: build panic", isGuestError},
		{"header injection", upstream.BuildInput{Params: map[string]string{"a": "1", "mode": "bad-header"}}, "control character", isGuestError},
		{"undeclared param", upstream.BuildInput{Params: map[string]string{"a": "1", "zz": "2", "yy": "3"}}, "params not declared by the plugin: yy, zz", nil},
		{"missing required param", upstream.BuildInput{Params: map[string]string{"b": "1"}}, "param a is required", nil},
		{"undeclared secret", upstream.BuildInput{Params: map[string]string{"a": "1"}, Secrets: map[string]string{"apiKey": "k"}}, "secrets not declared by the plugin: apiKey", nil},
		{"negative count", upstream.BuildInput{Params: map[string]string{"a": "1"}, Count: -1}, "negative count", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.BuildRequest(context.Background(), tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
			if tc.check != nil && !tc.check(err) {
				t.Fatalf("err = %v (%T): wrong type", err, err)
			}
		})
	}
	t.Run("empty method is GET", func(t *testing.T) {
		req, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"a": "1", "mode": "empty-method"}})
		if err != nil || req.Method != "GET" {
			t.Fatalf("req = %+v, err = %v", req, err)
		}
	})
}

func isGuestError(err error) bool {
	var g *wasm.GuestError
	return errors.As(err, &g)
}

func isVendorError(err error) bool {
	var v *plugin.VendorError
	return errors.As(err, &v)
}

func TestTCKParseEcho(t *testing.T) {
	t.Parallel()
	a := shared(t, "tck")
	body := []byte{0, 1, 2, 0xff, 0xfe, '"', '\\', '\n'} // not UTF-8: travels as base64
	res, err := a.ParseResponse(context.Background(), upstream.Response{
		Status:  203,
		Headers: map[string]string{"X-Test": "yes"},
		Body:    body,
		Params:  map[string]string{"a": "1", "undeclared": "ignored"},
	}, tckNow)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Proxies) != 1 {
		t.Fatalf("got %d proxies", len(res.Proxies))
	}
	want := map[string]string{
		"status":  "203",
		"header":  "yes",
		"params":  "a=1,b=dflt,mode=echo",
		"now":     tckNow.Format(time.RFC3339Nano),
		"clock":   tckNow.Format(time.RFC3339Nano),
		"bodyHex": hex.EncodeToString(body),
		"bodyLen": "8",
	}
	if got := res.Proxies[0].Tags; !reflect.DeepEqual(got, want) {
		t.Fatalf("guest saw %v\nwant %v", got, want)
	}
}

func TestTCKParseProxies(t *testing.T) {
	t.Parallel()
	a := shared(t, "tck")
	exp := time.Date(2026, 11, 29, 23, 1, 3, 500000000, time.UTC)
	body := `[
	  {"scheme":"SOCKS5","host":"[2001:db8::7]","port":1080,"username":"u","password":"p:w@x","ttl":90.5,
	   "expiresAt":"2026-11-30T07:01:03.5+08:00","region":"cn-sh","carrier":"ct","tags":{"pool":"a","tier":""}},
	  {"host":"proxy.vendor.example","port":65535}
	]`
	res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Body: []byte(body), Params: map[string]string{"mode": "proxies"}}, tckNow)
	if err != nil {
		t.Fatal(err)
	}
	want := []proxy.Candidate{
		{Scheme: proxy.SchemeSOCKS5, Host: "2001:db8::7", Port: 1080, Username: "u", Password: "p:w@x", TTL: 90500 * time.Millisecond,
			ExpiresAt: exp, Region: "cn-sh", Carrier: "ct", Tags: map[string]string{"pool": "a", "tier": ""}},
		{Scheme: proxy.SchemeHTTP, Host: "proxy.vendor.example", Port: 65535},
	}
	if !reflect.DeepEqual(res.Proxies, want) {
		t.Fatalf("proxies = %+v\nwant %+v", res.Proxies, want)
	}
}

func TestTCKParseOutcomes(t *testing.T) {
	t.Parallel()
	a := shared(t, "tck")
	cases := []struct {
		name      string
		mode      string
		status    int
		headers   map[string]string
		wantErr   string
		check     func(error) bool
		wantN     int
		wantRetry time.Duration
	}{
		{name: "accepted status", mode: "status", status: 204},
		{name: "rate limited", mode: "status", status: 429, headers: map[string]string{"retry-after": "7"},
			wantErr: "unexpected http status 429", check: isStatus(429), wantRetry: 7 * time.Second},
		{name: "http date", mode: "status", status: 503, headers: map[string]string{"Retry-After": tckNow.Add(90 * time.Second).Format("Mon, 02 Jan 2006 15:04:05 GMT")},
			// The date has whole seconds; the fetch time has nanoseconds.
			wantErr: "status 503", check: isStatus(503), wantRetry: tckNow.Add(90 * time.Second).Truncate(time.Second).Sub(tckNow)},
		{name: "server error", mode: "status", status: 500, wantErr: "status 500", check: isStatus(500)},
		{name: "vendor error", mode: "vendor", status: 200, wantErr: "vendor reported an error: balance exhausted", check: isVendorError},
		{name: "entry error", mode: "entry", status: 200, wantErr: "proxy 1: field port: not a port", check: isGuestError},
		{name: "retry hint", mode: "retry", status: 200, wantRetry: 30 * time.Second},
		{name: "panic is recovered", mode: "panic", status: 200, wantErr: "plugin panicked: parse panic", check: isGuestError},
		{name: "empty", mode: "empty", status: 200},
		{name: "unknown mode", mode: "nope", status: 200, wantErr: "unknown mode nope", check: isGuestError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := a.ParseResponse(context.Background(), upstream.Response{Status: tc.status, Headers: tc.headers, Params: map[string]string{"mode": tc.mode}}, tckNow)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("err = %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
			if tc.check != nil && !tc.check(err) {
				t.Fatalf("err = %v (%T): wrong type", err, err)
			}
			if len(res.Proxies) != tc.wantN || res.RetryAfter != tc.wantRetry {
				t.Fatalf("result = %d proxies, retry %s; want %d, %s", len(res.Proxies), res.RetryAfter, tc.wantN, tc.wantRetry)
			}
		})
	}
}

func isStatus(code int) func(error) bool {
	return func(err error) bool {
		var se *plugin.StatusError
		return errors.As(err, &se) && se.Status == code
	}
}
