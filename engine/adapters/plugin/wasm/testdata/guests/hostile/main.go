// Command hostile is a test guest that tries to leave the sandbox. The
// "mode" param selects the attempt; BuildRequest reports what it saw in
// the request URL, or fails with the error it got.
package main

import (
	"errors"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"
	"unsafe"

	"github.com/proxypool/proxypool/sdk"
)

func init() {
	sdk.Register(sdk.Plugin{
		Description: "sandbox probes",
		Params:      []sdk.Param{{Name: "mode", Required: true}, {Name: "addr"}},
		BuildRequest: func(in sdk.BuildInput) (sdk.Request, error) {
			q, err := probe(in)
			if err != nil {
				return sdk.Request{}, err
			}
			return sdk.Request{URL: "http://vendor.example/?" + q.Encode()}, nil
		},
		ParseResponse: func(r sdk.Response) (sdk.Result, error) {
			return sdk.Result{Proxies: []sdk.Proxy{{Host: "203.0.113.1", Port: 8080}}}, nil
		},
	})
}

func main() {}

// hoard keeps allocations reachable so the collector cannot free them.
var hoard [][]byte

func probe(in sdk.BuildInput) (url.Values, error) {
	q := url.Values{}
	switch in.Params["mode"] {
	case "ok":
		q.Set("ok", "1")
	case "file":
		for _, p := range []string{"/etc/passwd", "passwd", "/"} {
			if _, err := os.ReadFile(p); err == nil {
				return nil, errors.New("read " + p)
			}
		}
		_, err := os.ReadDir("/")
		if err == nil {
			return nil, errors.New("listed /")
		}
		if err := os.WriteFile("/tmp/escape", []byte("x"), 0o644); err == nil {
			return nil, errors.New("wrote /tmp/escape")
		}
		return nil, err
	case "env":
		q.Set("environ", strconv.Itoa(len(os.Environ())))
		q.Set("args", strconv.Itoa(len(os.Args)))
		q.Set("home", os.Getenv("HOME"))
		wd, err := os.Getwd()
		q.Set("wd", wd)
		if err != nil {
			q.Set("wderr", "1")
		}
		if h, err := os.Hostname(); err == nil {
			q.Set("hostname", h)
		}
	case "stdin":
		n, err := os.Stdin.Read(make([]byte, 16))
		q.Set("stdin", strconv.Itoa(n))
		if err != nil {
			q.Set("stdinerr", "1")
		}
	case "dial":
		// Go's net package on wasip1 is an in-process simulation unless
		// the host hands the module socket descriptors; the host under
		// test hands none, so this must never reach addr.
		c, err := net.Dial("tcp", in.Params["addr"])
		if err == nil {
			c.Close()
			return nil, errors.New("dialled " + in.Params["addr"])
		}
		return nil, err
	case "resolve":
		addrs, err := net.LookupHost("localhost")
		if err == nil {
			return nil, errors.New("resolved localhost to " + strconv.Itoa(len(addrs)) + " addresses")
		}
		return nil, err
	case "clock":
		q.Set("now", time.Now().UTC().Format(time.RFC3339Nano))
		q.Set("input", in.Now.UTC().Format(time.RFC3339Nano))
	case "sleep":
		start := time.Now()
		time.Sleep(24 * time.Hour)
		q.Set("slept", time.Since(start).String())
	case "loop":
		for {
		}
	case "oom":
		for {
			hoard = append(hoard, make([]byte, 1<<20))
		}
	case "panic":
		panic("boom")
	case "goroutine-panic":
		done := make(chan struct{})
		go func() {
			defer close(done)
			panic("boom in a goroutine")
		}()
		<-done
	case "exit":
		os.Exit(3)
	case "trap":
		// Go checks nil, not bounds of raw addresses: this load traps in
		// the wasm engine, beyond any memory the module has.
		p := (*byte)(unsafe.Pointer(uintptr(0xFFFFFFF0)))
		q.Set("byte", strconv.Itoa(int(*p)))
	default:
		return nil, errors.New("unknown mode")
	}
	return q, nil
}
