//go:build race

package wasm_test

// raceEnabled makes the tests load compiled code from a cache filled by a
// build without the race detector: a race-instrumented wazero compiles a Go
// module in half a minute, and the host code under test is the same.
const raceEnabled = true
