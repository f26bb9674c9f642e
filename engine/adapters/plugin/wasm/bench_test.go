package wasm_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/adapters/plugin/expr"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// list1000 is a json-list response of 1,000 proxies.
func list1000() []byte {
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < 1000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"ip":"203.0.%d.%d","port":%d,"user":"user%d","pass":"pass%d","ttl":300}`, i/250, i%250+1, 8000+i, i, i)
	}
	b.WriteByte(']')
	return []byte(b.String())
}

// BenchmarkParse1000 parses a 1,000-proxy response through the
// json-list-wasm module; allocs/op counts the host side only (the guest
// allocates in its own linear memory).
func BenchmarkParse1000(b *testing.B) {
	a := load(b, newHost(b, testConfig()), "json-list-wasm")
	resp := upstream.Response{Status: 200, Body: list1000(), Params: map[string]string{"url": "http://v.example/"}}
	b.SetBytes(int64(len(resp.Body)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := a.ParseResponse(context.Background(), resp, fetchTime)
		if err != nil || len(res.Proxies) != 1000 {
			b.Fatalf("%d proxies, %v", len(res.Proxies), err)
		}
	}
	b.ReportMetric(float64(a.Stats().Created), "instances")
}

// BenchmarkParse1000Expr is the same response through the json-list.yaml
// template, for comparison.
func BenchmarkParse1000Expr(b *testing.B) {
	data, err := os.ReadFile("../../../../plugins/json-list.yaml")
	if err != nil {
		b.Fatal(err)
	}
	a, err := expr.Compile("json-list", data)
	if err != nil {
		b.Fatal(err)
	}
	resp := upstream.Response{Status: 200, Body: list1000(), Params: map[string]string{"url": "http://v.example/"}}
	b.SetBytes(int64(len(resp.Body)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := a.ParseResponse(context.Background(), resp, fetchTime)
		if err != nil || len(res.Proxies) != 1000 {
			b.Fatalf("%d proxies, %v", len(res.Proxies), err)
		}
	}
}

// BenchmarkCall is one small call on a pooled instance: alloc, build,
// free, JSON both ways.
func BenchmarkCall(b *testing.B) {
	a := load(b, newHost(b, testConfig()), "tck")
	in := upstream.BuildInput{Params: map[string]string{"a": "x"}, Count: 10, Now: fetchTime}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.BuildRequest(context.Background(), in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallParallel is BenchmarkCall from GOMAXPROCS goroutines
// sharing the plugin's pool.
func BenchmarkCallParallel(b *testing.B) {
	a := load(b, newHost(b, testConfig()), "tck")
	in := upstream.BuildInput{Params: map[string]string{"a": "x"}, Count: 10, Now: fetchTime}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.BuildRequest(context.Background(), in); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkLoadCached is a reload of an unchanged module: decoding and
// validation, a compilation cache hit, one instantiation (the Go runtime's
// initialisation) and the ABI checks.
func BenchmarkLoadCached(b *testing.B) {
	keep(b, "json-list-wasm")
	h := newHost(b, testConfig())
	data := guestBytes(b, "json-list-wasm")
	b.ReportAllocs()
	for b.Loop() {
		a, err := h.Load("json-list-wasm", data)
		if err != nil {
			b.Fatal(err)
		}
		_ = a.Close()
	}
}
