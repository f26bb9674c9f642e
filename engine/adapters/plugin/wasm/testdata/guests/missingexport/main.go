// Command missingexport lacks proxypool_parse_response and exports
// proxypool_free with the wrong type. The host must refuse it at load,
// naming both.
package main

//go:wasmexport proxypool_abi_version
func abi() int32 { return 1 }

//go:wasmexport proxypool_alloc
func alloc(n uint32) uint32 { return 0 }

//go:wasmexport proxypool_free
func free(p uint32) {}

//go:wasmexport proxypool_describe
func describe() uint64 { return 0 }

//go:wasmexport proxypool_build_request
func build(p, n uint32) uint64 { return 0 }

func main() {}
