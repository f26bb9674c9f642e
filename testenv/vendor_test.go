package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

type vendorReply struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
	Data struct {
		List []vendorItem `json:"list"`
	} `json:"data"`
}

var testProxies = []VendorProxy{
	{Host: "127.0.0.1", Port: 1001, Username: "u1", Password: "p1", Region: "us", Carrier: "c1"},
	{Host: "127.0.0.1", Port: 1002, Region: "de", Carrier: "c2"},
	{Host: "127.0.0.1", Port: 1003, Username: "u3", Password: "p3", Region: "jp", Carrier: "c3"},
}

func newTestVendor(t *testing.T, cfg VendorConfig) *Vendor {
	t.Helper()
	v, err := NewVendor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func vendorGet(t *testing.T, v *Vendor, query string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, v.URL()+"/v1/proxies?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := directClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", query, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp, body
}

func decodeVendor(t *testing.T, body []byte) vendorReply {
	t.Helper()
	var r vendorReply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
	return r
}

func TestVendorNormalJSONRotates(t *testing.T) {
	v := newTestVendor(t, VendorConfig{Proxies: testProxies, TTL: time.Minute})
	resp, body := vendorGet(t, v, "count=2", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	r := decodeVendor(t, body)
	if r.Code != 0 || r.Msg != "ok" || len(r.Data.List) != 2 {
		t.Fatalf("reply %+v", r)
	}
	first := r.Data.List[0]
	if first.IP != "127.0.0.1" || first.Port != 1001 || first.Username != "u1" || first.Password != "p1" ||
		first.TTL != 60 || first.Region != "us" || first.Carrier != "c1" {
		t.Fatalf("first item %+v", first)
	}
	exp, err := time.Parse(time.RFC3339, first.ExpireAt)
	if err != nil || time.Until(exp) < 50*time.Second || time.Until(exp) > 61*time.Second {
		t.Fatalf("expire_at %q (err %v), want about now+1m", first.ExpireAt, err)
	}
	if bytes.Count(body, []byte(`"username"`)) != 1 {
		t.Fatalf("username not omitted for proxy without credentials: %s", body)
	}

	r = decodeVendor(t, mustBody(vendorGet(t, v, "count=2", nil)))
	if got := []int{r.Data.List[0].Port, r.Data.List[1].Port}; got[0] != 1003 || got[1] != 1001 {
		t.Fatalf("second batch ports %v, want rotation [1003 1001]", got)
	}
	r = decodeVendor(t, mustBody(vendorGet(t, v, "count=5000", nil)))
	if len(r.Data.List) != len(testProxies) {
		t.Fatalf("count above list size returned %d items", len(r.Data.List))
	}
	if resp, _ := vendorGet(t, v, "count=abc", nil); resp.StatusCode != 400 {
		t.Fatalf("bad count: status %d", resp.StatusCode)
	}
	if resp, _ := vendorGet(t, v, "format=xml", nil); resp.StatusCode != 400 {
		t.Fatalf("bad format: status %d", resp.StatusCode)
	}
	if got := v.Calls(); got != 5 {
		t.Fatalf("Calls = %d, want 5", got)
	}
}

func mustBody(_ *http.Response, body []byte) []byte { return body }

func TestVendorNormalTextAndSetProxies(t *testing.T) {
	v := newTestVendor(t, VendorConfig{Proxies: testProxies})
	resp, body := vendorGet(t, v, "count=3&format=text", nil)
	want := "127.0.0.1:1001:u1:p1\n127.0.0.1:1002\n127.0.0.1:1003:u3:p3\n"
	if resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("status %d body %q, want %q", resp.StatusCode, body, want)
	}
	v.SetProxies([]VendorProxy{{Host: "127.0.0.9", Port: 9}})
	if _, body := vendorGet(t, v, "format=text", nil); string(body) != "127.0.0.9:9\n" {
		t.Fatalf("after SetProxies: %q", body)
	}
}

func TestVendorModes(t *testing.T) {
	v := newTestVendor(t, VendorConfig{Proxies: testProxies, SlowDelay: 100 * time.Millisecond})
	for _, tc := range []struct {
		mode   VendorMode
		format string
		status int
		check  func(t *testing.T, resp *http.Response, body []byte)
	}{
		{VendorEmpty, "json", 200, func(t *testing.T, _ *http.Response, body []byte) {
			if r := decodeVendor(t, body); r.Code != 0 || r.Data.List == nil || len(r.Data.List) != 0 || !bytes.Contains(body, []byte(`"list":[]`)) {
				t.Errorf("empty json %s", body)
			}
		}},
		{VendorEmpty, "text", 200, func(t *testing.T, _ *http.Response, body []byte) {
			if len(body) != 0 {
				t.Errorf("empty text %q", body)
			}
		}},
		{VendorError500, "json", 500, nil},
		{VendorError500, "text", 500, nil},
		{VendorRateLimited, "json", 429, checkRetryAfter},
		{VendorRateLimited, "text", 429, checkRetryAfter},
		{VendorSlow, "json", 200, func(t *testing.T, _ *http.Response, body []byte) { decodeVendor(t, body) }},
		{VendorSlow, "text", 200, nil},
		{VendorMalformed, "json", 200, func(t *testing.T, _ *http.Response, body []byte) {
			var r vendorReply
			if err := json.Unmarshal(body, &r); err == nil {
				t.Errorf("malformed json parsed fine: %s", body)
			}
		}},
		{VendorMalformed, "text", 200, func(t *testing.T, _ *http.Response, body []byte) {
			if !bytes.Contains(body, []byte("not-a-proxy")) {
				t.Errorf("malformed text %q", body)
			}
		}},
		{VendorAuthRequired, "json", 401, nil},
		{VendorAuthRequired, "text", 401, nil},
	} {
		t.Run(tc.mode.String()+"/"+tc.format, func(t *testing.T) {
			v.SetMode(tc.mode)
			start := time.Now()
			resp, body := vendorGet(t, v, "count=2&format="+tc.format, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d (body %q)", resp.StatusCode, tc.status, body)
			}
			if tc.mode == VendorSlow && time.Since(start) < 100*time.Millisecond {
				t.Errorf("slow mode answered after %v", time.Since(start))
			}
			if tc.check != nil {
				tc.check(t, resp, body)
			}
		})
	}
}

func checkRetryAfter(t *testing.T, resp *http.Response, _ []byte) {
	if got := resp.Header.Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q", got)
	}
}

func TestVendorSlowHonoursCancellation(t *testing.T) {
	v := newTestVendor(t, VendorConfig{Proxies: testProxies}) // default 5s delay
	v.SetMode(VendorSlow)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, v.URL()+"/v1/proxies", nil)
	start := time.Now()
	_, err := directClient.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if err := v.Close(); err != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("Close: err=%v after %v", err, time.Since(start))
	}
}

func TestVendorDuplicateOnly(t *testing.T) {
	v := newTestVendor(t, VendorConfig{Proxies: testProxies})
	_, first := vendorGet(t, v, "count=2", nil)
	v.SetMode(VendorDuplicateOnly)
	for range 2 {
		if _, body := vendorGet(t, v, "count=3", nil); !bytes.Equal(body, first) {
			t.Fatalf("duplicate batch %s, want first batch %s", body, first)
		}
	}
	_, text := vendorGet(t, v, "format=text", nil)
	if string(text) != "127.0.0.1:1001:u1:p1\n127.0.0.1:1002\n" {
		t.Fatalf("duplicate text %q", text)
	}
}

func TestVendorAPIKey(t *testing.T) {
	v := newTestVendor(t, VendorConfig{Proxies: testProxies, APIKey: "secret"})
	if resp, _ := vendorGet(t, v, "", nil); resp.StatusCode != 401 {
		t.Fatalf("no key: status %d", resp.StatusCode)
	}
	if resp, _ := vendorGet(t, v, "key=wrong", nil); resp.StatusCode != 401 {
		t.Fatalf("wrong key: status %d", resp.StatusCode)
	}
	if resp, _ := vendorGet(t, v, "key=secret", nil); resp.StatusCode != 200 {
		t.Fatalf("query key: status %d", resp.StatusCode)
	}
	if resp, _ := vendorGet(t, v, "", http.Header{"X-Api-Key": {"secret"}}); resp.StatusCode != 200 {
		t.Fatalf("header key: status %d", resp.StatusCode)
	}
	v.SetMode(VendorAuthRequired)
	if resp, _ := vendorGet(t, v, "key=secret", nil); resp.StatusCode != 401 {
		t.Fatalf("auth-required mode: status %d", resp.StatusCode)
	}
	if resp, err := directClient.Get(v.URL() + "/nope"); err != nil || resp.StatusCode != 404 {
		t.Fatalf("unknown path: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if !strings.HasPrefix(v.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL %s", v.URL())
	}
}
