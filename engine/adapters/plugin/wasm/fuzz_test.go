package wasm

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Fuzzing the host side of the ABI: everything a guest returns is hostile
// input. Seeds live in testdata/fuzz/<Target>/ and in the f.Add calls.

func FuzzDecodeParseOutput(f *testing.F) {
	for _, s := range []string{
		`{"proxies":[{"host":"203.0.113.1","port":8080}]}`,
		`{"proxies":[{"scheme":"SOCKS5","host":"[2001:db8::1]","port":1080,"username":"u","password":"p","ttlSeconds":90.5,"expiresAt":"2026-01-01T00:00:00Z","region":"r","carrier":"c","tags":{"a":"b"}}],"retryAfterSeconds":3}`,
		`{"proxies":[],"retryAfterSeconds":5,"error":{"kind":"status","message":"x","status":429}}`,
		`{"error":{"kind":"vendor","message":"balance"}}`,
		`{"error":{"kind":"plugin","message":"x"}}`,
		`{"proxies":null}`,
		`{"proxies":[{"host":"127.1","port":1}]}`,
		`{"proxies":[{"host":"a","port":0}]}`,
		`{"proxies":[{"host":"a","port":1,"ttlSeconds":1e300}]}`,
		`{"proxies":[{"host":"a","port":1,"tags":{"":"x"}}]}`,
		`{"retryAfterSeconds":-0}`,
		`{"proxies":[1]}`,
		`{} {}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := decodeParseOutput(data)
		if res.RetryAfter < 0 || res.RetryAfter > plugin.MaxRetryAfter {
			t.Fatalf("retry after %s out of bounds", res.RetryAfter)
		}
		if err != nil {
			if len(res.Proxies) != 0 {
				t.Fatalf("error %v with %d proxies", err, len(res.Proxies))
			}
			if errors.Is(err, ErrBadOutput) && len(err.Error()) > 4096 {
				t.Fatalf("unbounded error message: %d bytes", len(err.Error()))
			}
			return
		}
		if len(res.Proxies) > plugin.MaxProxies {
			t.Fatalf("%d proxies", len(res.Proxies))
		}
		for i := range res.Proxies {
			if err := plugin.CheckCandidate(&res.Proxies[i]); err != nil {
				t.Fatalf("proxy %d passes decoding but not the host check: %v", i, err)
			}
		}
	})
}

func FuzzDecodeBuildOutput(f *testing.F) {
	for _, s := range []string{
		`{"request":{"method":"GET","url":"http://vendor.example/x?a=1"}}`,
		`{"request":{"method":"POST","url":"https://vendor.example/","headers":{"X-A":"1"},"body":"eyJhIjoxfQ=="}}`,
		`{"request":{"method":"","url":"http://v.example/"}}`,
		`{"request":{"method":"GET","url":"http://v.example/","headers":{"X":"a\r\nb"}}}`,
		`{"request":{"method":"GET","url":"file:///etc/passwd"}}`,
		`{"error":{"kind":"plugin","message":"no"}}`,
		`{"error":{"kind":"status","message":"x","status":99}}`,
		`{"request":null,"error":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeBuildOutput(data)
		if err != nil {
			if req.URL != "" || req.Method != "" {
				t.Fatalf("error %v with a request", err)
			}
			return
		}
		if err := plugin.CheckRequest(req); err != nil {
			t.Fatalf("request passes decoding but not the host check: %v", err)
		}
	})
}

func FuzzDecodeDescription(f *testing.F) {
	for _, s := range []string{
		`{"description":"d","params":[{"name":"url","required":true},{"name":"x","default":"1"}],"secrets":["apiKey"]}`,
		`{"params":[{"name":"a"},{"name":"a"}]}`,
		`{"params":[{"name":"1a"}]}`,
		`{"secrets":[""]}`,
		`{"error":{"kind":"plugin","message":"no plugin registered"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeDescription(data)
		if err != nil {
			return
		}
		if len(d.Params) > maxDeclared || len(d.Secrets) > maxDeclared || len(d.Text) > maxDescription+len("…") {
			t.Fatalf("unbounded description %+v", d)
		}
		seen := map[string]bool{}
		for _, p := range d.Params {
			if checkDeclName(p.Name) != nil || seen[p.Name] {
				t.Fatalf("bad or duplicate param %q", p.Name)
			}
			seen[p.Name] = true
		}
	})
}

func FuzzUnpackOutput(f *testing.F) {
	f.Add(uint64(0), uint32(65536))
	f.Add(uint64(1024)<<32|16, uint32(65536))
	f.Add(uint64(0xFFFFFFFF)<<32|0xFFFF, uint32(0xFFFFFFFF))
	f.Add(uint64(65530)<<32|16, uint32(65536))
	f.Fuzz(func(t *testing.T, packed uint64, memSize uint32) {
		const limit = 1 << 20
		ptr, n, err := unpackOutput(packed, memSize, limit)
		if err != nil {
			return
		}
		if n == 0 || n > limit || uint64(ptr)+uint64(n) > uint64(memSize) {
			t.Fatalf("accepted %#x+%d with memory %d", ptr, n, memSize)
		}
		if uint64(ptr)<<32|uint64(n) != packed {
			t.Fatalf("unpacked %#x+%d from %#x", ptr, n, packed)
		}
	})
}

// FuzzDecodeProxy is differential: a proxy entry built from the fuzzed
// fields must decode exactly when the domain and host checks accept those
// fields, and then to those fields.
func FuzzDecodeProxy(f *testing.F) {
	f.Add("203.0.113.1", 8080, "u", "p", 1.5)
	f.Add("[2001:db8::1]", 1, "", "", 0.0)
	f.Add("proxy.example", 65535, "a\x00", "", 3.0)
	f.Add("127.1", 80, "", "", -1.0)
	f.Add("0x7f.0.0.1", 80, "", "", 1e12)
	f.Fuzz(func(t *testing.T, host string, port int, user, pass string, ttl float64) {
		if math.IsNaN(ttl) || math.IsInf(ttl, 0) || !validUTF8(host, user, pass) {
			return // not representable in JSON: encoding/json replaces invalid UTF-8
		}
		entry, err := json.Marshal(map[string]any{"host": host, "port": port, "username": user, "password": pass, "ttlSeconds": ttl})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := json.Marshal(map[string]any{"proxies": []json.RawMessage{entry}})
		res, err := decodeParseOutput(out)

		want := proxy.Candidate{Scheme: proxy.SchemeHTTP, Host: host, Port: uint16(port), Username: user, Password: pass,
			TTL: time.Duration(ttl * float64(time.Second))}
		if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
			want.Host = host[1 : len(host)-1]
		}
		accept := port >= 1 && port <= 65535 && ttl >= 0 && ttl <= maxTTL.Seconds() &&
			plugin.CheckCandidate(&want) == nil
		if accept != (err == nil) {
			t.Fatalf("decode err = %v, oracle accepts = %v (%+v)", err, accept, want)
		}
		if err == nil && (len(res.Proxies) != 1 || !sameCandidate(res.Proxies[0], want)) {
			t.Fatalf("decoded %+v, want %+v", res.Proxies, want)
		}
	})
}

// validUTF8 reports whether encoding/json keeps the strings as they are.
func validUTF8(ss ...string) bool {
	for _, s := range ss {
		b, _ := json.Marshal(s)
		var back string
		if json.Unmarshal(b, &back) != nil || back != s {
			return false
		}
	}
	return true
}

func sameCandidate(a, b proxy.Candidate) bool {
	return a.Scheme == b.Scheme && a.Host == b.Host && a.Port == b.Port && a.Username == b.Username &&
		a.Password == b.Password && a.TTL == b.TTL && a.ExpiresAt.Equal(b.ExpiresAt) && len(a.Tags) == 0 && len(b.Tags) == 0
}
