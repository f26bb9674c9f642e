// Command rawabi implements ABI v1 by hand, without the SDK, to return
// what the SDK never would: malformed JSON, pointers outside memory,
// oversize lengths. The "mode" param, found by substring in the input,
// selects the fault. Built with -ldflags=-X main.abiVersion=2 it is the
// wrong-version guest; built without -buildmode=c-shared, the command one.
package main

import (
	"strconv"
	"strings"
	"unsafe"
)

// abiVersion is a string so -ldflags=-X can change it.
var abiVersion = "1"

var pinned = map[uint32][]byte{}

// failNextAlloc makes the next proxypool_alloc return an address outside
// memory.
var failNextAlloc bool

func pin(b []byte) uint32 {
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	pinned[p] = b
	return p
}

func out(s string) uint64 {
	b := []byte(s)
	return uint64(pin(b))<<32 | uint64(len(b))
}

//go:wasmexport proxypool_abi_version
func abi() int32 {
	v, _ := strconv.Atoi(abiVersion)
	return int32(v)
}

//go:wasmexport proxypool_alloc
func alloc(n uint32) uint32 {
	if failNextAlloc {
		failNextAlloc = false
		return 0xFFFFFFF0
	}
	return pin(make([]byte, max(n, 1)))
}

//go:wasmexport proxypool_free
func free(p, n uint32) { delete(pinned, p) }

//go:wasmexport proxypool_describe
func describe() uint64 {
	return out(`{"description":"raw","params":[{"name":"mode","required":true}],"secrets":[]}`)
}

func mode(p, n uint32) string {
	in := string(pinned[p][:n])
	delete(pinned, p)
	const key = `"mode":"`
	i := strings.Index(in, key)
	if i < 0 {
		return ""
	}
	rest := in[i+len(key):]
	return rest[:strings.IndexByte(rest, '"')]
}

//go:wasmexport proxypool_build_request
func build(p, n uint32) uint64 {
	switch mode(p, n) {
	case "ok":
		return out(`{"request":{"method":"GET","url":"http://vendor.example/ok"}}`)
	case "badjson":
		return out(`{"request":`)
	case "trailing":
		return out(`{"request":{"method":"GET","url":"http://vendor.example/"}} {}`)
	case "unknownfield":
		return out(`{"request":{"method":"GET","url":"http://vendor.example/"},"extra":1}`)
	case "both":
		return out(`{"request":{"method":"GET","url":"http://vendor.example/"},"error":{"kind":"plugin","message":"x"}}`)
	case "neither":
		return out(`{}`)
	case "badkind":
		return out(`{"error":{"kind":"weird","message":"x"}}`)
	case "badrequest":
		return out(`{"request":{"method":"GET","url":"file:///etc/passwd"}}`)
	case "ctlmessage":
		return out(`{"error":{"kind":"plugin","message":"line1\nline2\u0000` + strings.Repeat("x", 1000) + `"}}`)
	case "oob":
		return 0xFFFF0000<<32 | 100
	case "wrap":
		return 0xFFFFFFFF<<32 | 0xFFFF
	case "oversize":
		return 16<<32 | (32 << 20)
	case "zero":
		return 0
	case "badalloc-next":
		failNextAlloc = true
		return out(`{"request":{"method":"GET","url":"http://vendor.example/armed"}}`)
	case "panic":
		panic("raw boom")
	case "exit0":
		// A Go guest cannot call proc_exit(0) from an export more directly.
		exit(0)
	}
	return out(`{"error":{"kind":"plugin","message":"unknown mode"}}`)
}

//go:wasmimport wasi_snapshot_preview1 proc_exit
func exit(code int32)

//go:wasmexport proxypool_parse_response
func parse(p, n, bodyPtr, bodyLen uint32) uint64 {
	delete(pinned, bodyPtr)
	switch mode(p, n) {
	case "ok":
		return out(`{"proxies":[{"host":"203.0.113.1","port":8080}],"retryAfterSeconds":0}`)
	case "badport":
		return out(`{"proxies":[{"host":"203.0.113.1","port":8080},{"host":"203.0.113.2","port":70000}]}`)
	case "badhost":
		return out(`{"proxies":[{"host":"127.1","port":8080}]}`)
	case "wrongtype":
		return out(`{"proxies":[{"host":"203.0.113.1","port":"8080"}]}`)
	case "unknownproxyfield":
		return out(`{"proxies":[{"host":"203.0.113.1","port":8080,"ttl":3}]}`)
	case "negativeretry":
		return out(`{"proxies":[],"retryAfterSeconds":-1}`)
	case "hugeretry":
		return out(`{"proxies":[],"retryAfterSeconds":1e300}`)
	case "badstatus":
		return out(`{"error":{"kind":"status","message":"x","status":42}}`)
	case "toomany":
		var b strings.Builder
		b.WriteString(`{"proxies":[`)
		for i := 0; i < 10001; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"host":"203.0.113.1","port":` + strconv.Itoa(1+i%65535) + `}`)
		}
		b.WriteString(`]}`)
		return out(b.String())
	}
	return out(`{"error":{"kind":"plugin","message":"unknown mode"}}`)
}

func main() {}
