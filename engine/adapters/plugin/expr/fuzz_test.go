package expr_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/adapters/plugin/expr"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

var shippedNames = []string{"json-envelope", "json-list", "text-lines"}

// FuzzParseResponse feeds arbitrary responses to the shipped templates,
// unguarded so a panic is not hidden by the host's recover. Seeds are the
// recorded and hand-written fixtures in testdata/responses. Whatever the
// input: no panic, and a successful parse only yields candidates the host
// accepts.
func FuzzParseResponse(f *testing.F) {
	for i, name := range shippedNames {
		files, err := filepath.Glob(filepath.Join("testdata", "responses", name, "*"))
		if err != nil {
			f.Fatal(err)
		}
		for _, file := range files {
			body, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(i), uint16(200), "", body)
		}
	}
	f.Add(uint8(0), uint16(429), "3", []byte(`{}`))
	f.Add(uint8(2), uint16(503), "Wed, 21 Oct 2015 07:28:00 GMT", []byte(``))

	adapters := make([]*expr.Adapter, len(shippedNames))
	for i, n := range shippedNames {
		adapters[i] = shipped(f, n)
	}
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, which uint8, status uint16, retryAfter string, body []byte) {
		a := adapters[int(which)%len(adapters)]
		resp := upstream.Response{Status: int(status), Headers: map[string]string{"Retry-After": retryAfter}, Body: body,
			Params: map[string]string{"ttl": "60"}}
		res, err := a.ParseResponse(context.Background(), resp, now)
		if res.RetryAfter < 0 || res.RetryAfter > plugin.MaxRetryAfter {
			t.Fatalf("RetryAfter %s out of bounds", res.RetryAfter)
		}
		if err != nil {
			if len(res.Proxies) != 0 {
				t.Fatalf("error with %d proxies", len(res.Proxies))
			}
			return
		}
		if len(res.Proxies) > plugin.MaxProxies {
			t.Fatalf("%d proxies", len(res.Proxies))
		}
		for i := range res.Proxies {
			if err := plugin.CheckCandidate(&res.Proxies[i]); err != nil {
				t.Fatalf("proxy %d passed the template but fails the host: %v", i, err)
			}
		}
	})
}

// envelopeBody is a json-envelope response of n proxies, as the simulated
// vendor writes it.
func envelopeBody(tb testing.TB, n int) []byte {
	type item struct {
		IP       string `json:"ip"`
		Port     int    `json:"port"`
		Username string `json:"username"`
		Password string `json:"password"`
		TTL      int    `json:"ttl"`
		ExpireAt string `json:"expire_at"`
		Region   string `json:"region"`
		Carrier  string `json:"carrier"`
	}
	list := make([]item, n)
	for i := range list {
		list[i] = item{IP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), Port: 10000 + i%50000,
			Username: fmt.Sprintf("user%d", i), Password: "secret", TTL: 600,
			ExpireAt: "2027-01-15T08:10:00Z", Region: "cn-sh", Carrier: "ct"}
	}
	body, err := json.Marshal(map[string]any{"code": 0, "msg": "ok", "data": map[string]any{"list": list}})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

func BenchmarkParseResponseJSON1000(b *testing.B) {
	a := shipped(b, "json-envelope")
	body := envelopeBody(b, 1000)
	resp := upstream.Response{Status: 200, Body: body}
	now := time.Unix(1_800_000_000, 0)
	ctx := context.Background()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := a.ParseResponse(ctx, resp, now)
		if err != nil || len(res.Proxies) != 1000 {
			b.Fatalf("%d proxies, %v", len(res.Proxies), err)
		}
	}
}

func BenchmarkParseResponseLines1000(b *testing.B) {
	a := shipped(b, "text-lines")
	var body []byte
	for i := 0; i < 1000; i++ {
		body = fmt.Appendf(body, "10.0.%d.%d:%d:user%d:secret\n", i>>8, i&255, 10000+i, i)
	}
	resp := upstream.Response{Status: 200, Body: body, Params: map[string]string{"ttl": "300"}}
	now := time.Unix(1_800_000_000, 0)
	ctx := context.Background()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := a.ParseResponse(ctx, resp, now)
		if err != nil || len(res.Proxies) != 1000 {
			b.Fatalf("%d proxies, %v", len(res.Proxies), err)
		}
	}
}
