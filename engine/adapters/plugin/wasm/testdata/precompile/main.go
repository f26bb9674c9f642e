// Command precompile fills a wazero compilation cache directory with the
// given modules, compiled as the wasm host compiles them. The package's
// tests run it, built without the race detector, before a -race run: a
// race-instrumented wazero compiles a Go module in half a minute, this
// does it in a few seconds, and the tests then load the machine code from
// the cache.
//
//	go run ./testdata/precompile -dir DIR a.wasm b.wasm ...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/tetratelabs/wazero"
)

func main() {
	dir := flag.String("dir", "", "cache directory")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "precompile: -dir is required")
		os.Exit(2)
	}
	ctx := context.Background()
	cache, err := wazero.NewCompilationCacheWithDir(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "precompile:", err)
		os.Exit(1)
	}
	defer cache.Close(ctx)
	// Close-on-context-done changes the generated code (and the cache
	// key); it must match the host's runtime configuration.
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().
		WithCompilationCache(cache).
		WithCloseOnContextDone(true).
		WithDebugInfoEnabled(false))
	defer rt.Close(ctx)

	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.NumCPU())
	failed := false
	var mu sync.Mutex
	for _, path := range flag.Args() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			b, err := os.ReadFile(path)
			if err == nil {
				_, err = rt.CompileModule(ctx, b)
			}
			if err != nil {
				mu.Lock()
				failed = true
				mu.Unlock()
				fmt.Fprintf(os.Stderr, "precompile: %s: %v\n", path, err)
			}
		}()
	}
	wg.Wait()
	if failed {
		os.Exit(1)
	}
}
