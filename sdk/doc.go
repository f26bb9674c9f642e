// Package sdk is the Go SDK for Proxy Pool provider plugins compiled to
// WebAssembly (seed 000 §8, §15; SPEC §9; docs/plugins.md).
//
// A plugin turns an upstream's params and secrets into one HTTP request,
// and the vendor's response into proxies. The host performs the HTTP call
// and hands the plugin nothing else: no files, network, environment or
// clock. An author writes two functions and registers them from init:
//
//	package main
//
//	import "github.com/proxypool/proxypool/sdk"
//
//	func init() {
//		sdk.Register(sdk.Plugin{
//			Params:        []sdk.Param{{Name: "url", Required: true}},
//			BuildRequest:  func(in sdk.BuildInput) (sdk.Request, error) { ... },
//			ParseResponse: func(r sdk.Response) (sdk.Result, error) { ... },
//		})
//	}
//
//	func main() {}
//
// and builds it as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o NAME.wasm .
//
// The SDK provides the exports of the proxypool ABI v1 (proxypool_abi_version,
// proxypool_alloc, proxypool_free, proxypool_describe,
// proxypool_build_request, proxypool_parse_response), moves JSON through
// linear memory, pins buffers the host holds, and turns a panic in the
// author's functions into an error. Those exports exist only in wasip1
// builds; the types and helpers build everywhere, so a plugin's logic can be
// unit-tested with a plain `go test` on the developer's machine.
//
// Errors: return a *StatusError for an HTTP status the plugin does not
// accept (CheckStatus does it, with Retry-After), a *VendorError for an
// error the vendor reported in an accepted response, an *EntryError for one
// bad proxy entry; anything else is reported as a plugin error. All of them
// count as a failed fetch (Error), never as an empty one.
//
// This package must never import anything outside the standard library:
// plugin authors depend on it alone.
package sdk
