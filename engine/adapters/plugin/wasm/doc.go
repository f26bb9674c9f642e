// Package wasm is the "wasm" plugin kind: provider adapters compiled to
// WebAssembly and run in github.com/tetratelabs/wazero (seed 000 §8, §15;
// SPEC §9). The ABI is described in docs/plugins.md; sdk/ is the Go SDK
// that implements its guest side.
//
// ABI v1 in one paragraph. A module is a WASI preview 1 reactor (Go:
// GOOS=wasip1 GOARCH=wasm, -buildmode=c-shared) exporting memory,
// _initialize, proxypool_abi_version() i32 (must return 1),
// proxypool_alloc(size i32) i32, proxypool_free(ptr, size i32),
// proxypool_describe() i64, proxypool_build_request(ptr, len i32) i64 and
// proxypool_parse_response(ptr, len, body_ptr, body_len i32) i64. Inputs
// and outputs are JSON documents in linear memory, except the response
// body, which travels raw; an i64 result packs an output as ptr<<32|len.
// The host writes each input into a buffer from proxypool_alloc and the
// guest owns it from the call on; the host copies an output and hands it
// back with proxypool_free.
//
// Sandbox. One wazero runtime per Host, with a memory ceiling
// (Config.MemoryLimitPages) and close-on-context-done, so a per-call
// deadline (Config.CallTimeout) kills a runaway guest. WASI is instantiated
// but every module gets a configuration without file system mounts,
// environment, arguments or stdin; stdout and stderr go to a bounded buffer
// quoted in crash errors; the wall clock reads the fetch time the host
// passes (never the real clock), the monotonic clock is synthetic and sleep
// returns at once, advancing it; random bytes come from crypto/rand (the
// Go runtime seeds its map hashing with them). A module importing anything
// but wasi_snapshot_preview1 functions is refused at load, before it runs.
//
// Instances. Compiled code is shared through a compilation cache; each
// plugin keeps a bounded pool of instantiated modules (Config.MaxInstances)
// so a fetch does not pay instantiation. An instance that trapped, exited,
// timed out or returned malformed output is closed, never reused. Outputs
// are decoded strictly and bounded (MaxOutputBytes, plugin.MaxProxies);
// the plugin package's guard validates them again like any kind's.
//
// Registration: init registers the kind for NAME.wasm files with a 32 MiB
// file bound (plugin.RegisterKindOptions); those load on the process-wide
// Default host, configured once with SetDefaultConfig. Host.Load serves
// callers that want their own host (tests, tools).
//
// Performance: wazero can stop a running guest only at checks compiled into
// every loop and function entry, each an exit to the host; a Go guest runs
// about four times slower with them, which a fetch path can afford and a
// runaway plugin cannot be allowed to cost (docs/plugins.md has figures).
//
// Typed errors: ErrABI (load), ErrGuestCrashed, ErrGuestTimeout,
// ErrBadOutput, *GuestError (an error the plugin reported), *EntryError,
// and the plugin package's *StatusError and *VendorError.
//
// This package must never import the controller or storage, and gives
// guests no I/O: no files, network, environment or real clock.
//
// Metrics: none; the controller counts fetch outcomes. Adapter.Stats
// exposes the pool's counters for callers that want them.
package wasm
