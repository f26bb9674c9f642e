// Command badimport imports functions the host does not provide: one from
// a module other than WASI, one WASI preview 1 never had. The host must
// refuse it at load, before any of it runs.
package main

//go:wasmimport env launch_missiles
func launchMissiles(n int32) int32

//go:wasmimport wasi_snapshot_preview1 sock_open
func sockOpen(af, kind int32) int32

//go:wasmexport proxypool_abi_version
func abi() int32 { return 1 + launchMissiles(0) + sockOpen(0, 0) }

//go:wasmexport proxypool_alloc
func alloc(n uint32) uint32 { return 0 }

//go:wasmexport proxypool_free
func free(p, n uint32) {}

//go:wasmexport proxypool_describe
func describe() uint64 { return 0 }

//go:wasmexport proxypool_build_request
func build(p, n uint32) uint64 { return 0 }

//go:wasmexport proxypool_parse_response
func parse(p, n, bp, bn uint32) uint64 { return 0 }

func main() {}
