package wasm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/proxypool/proxypool/engine/adapters/plugin/wasm"
)

// Guests are built from source once per test binary, never committed: the
// Go toolchain that runs the tests builds them.

// guestSpec is one module the tests need.
type guestSpec struct {
	dir     string // package directory, relative to this one
	ldflags string
	command bool // built as a command (_start), not a reactor
}

var guestSpecs = map[string]guestSpec{
	"tck":               {dir: "testdata/guests/tck"},
	"hostile":           {dir: "testdata/guests/hostile"},
	"rawabi":            {dir: "testdata/guests/rawabi"},
	"wrongabi":          {dir: "testdata/guests/rawabi", ldflags: "-X main.abiVersion=2"},
	"command":           {dir: "testdata/guests/rawabi", command: true},
	"badimport":         {dir: "testdata/guests/badimport"},
	"missingexport":     {dir: "testdata/guests/missingexport"},
	"json-list-wasm":    {dir: "../../../../plugins/src/json-list-wasm"},
	"ip-port-user-pass": {dir: "../../../../plugins/src/ip-port-user-pass"},
}

var guests struct {
	once  sync.Once
	dir   string
	paths map[string]string
	errs  map[string]error
}

// guestDir is removed by TestMain.
var guestDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "proxypool-wasm-guests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	guestDir = dir
	// The "wasm" kind (plugin.Load, plugin.LoadFile) uses the default
	// host: give it the tests' configuration.
	if err := wasm.SetDefaultConfig(testConfig()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildGuests builds every guest concurrently, bounded by the CPUs: the
// go command shares its build cache, so after the first build of the
// standard library for wasip1 each one is a link step.
func buildGuests() {
	start := time.Now()
	defer func() {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "built the guests in %s\n", time.Since(start).Round(time.Millisecond))
		}
	}()
	guests.paths = map[string]string{}
	guests.errs = map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(runtime.NumCPU(), 2))
	for name, spec := range guestSpecs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out := filepath.Join(guestDir, name+".wasm")
			err := buildGuest(spec, out)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				guests.errs[name] = err
				return
			}
			guests.paths[name] = out
		}()
	}
	wg.Wait()
	if raceEnabled {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "built the guests in %s, precompiling\n", time.Since(start).Round(time.Millisecond))
		}
		precompile()
	}
}

// cacheVersion is the version wazero files this binary's compiled code
// under: the X of the wazero-X-GOARCH-GOOS directory it creates.
func cacheVersion() (string, error) {
	c, err := wazero.NewCompilationCacheWithDir(cacheDir())
	if err != nil {
		return "", err
	}
	_ = c.Close(context.Background())
	ents, err := os.ReadDir(cacheDir())
	if err != nil {
		return "", err
	}
	suffix := "-" + runtime.GOARCH + "-" + runtime.GOOS
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, "wazero-") && strings.HasSuffix(n, suffix) {
			return strings.TrimSuffix(strings.TrimPrefix(n, "wazero-"), suffix), nil
		}
	}
	return "", fmt.Errorf("no wazero directory in %s", cacheDir())
}

// cacheDir is the compilation cache of -race runs, filled by precompile.
// It persists across runs like the go build cache (entries are keyed by the
// module's hash, wazero's version and the CPU, and checksummed), so only a
// changed guest is compiled again. PROXYPOOL_WASM_TEST_CACHE overrides it.
func cacheDir() string {
	if d := os.Getenv("PROXYPOOL_WASM_TEST_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "proxypool-wasm-test")
	}
	return filepath.Join(guestDir, "wazero-cache")
}

// precompile compiles the guests into cacheDir with a wazero built without
// the race detector (see testdata/precompile). A failure only costs time:
// the tests then compile under the race detector.
func precompile() {
	args := []string{"run"}
	if v, err := cacheVersion(); err == nil {
		// wazero files cached code under its own version, read from the
		// binary's build information, which test binaries lack ("dev"):
		// the helper must file under the same name.
		args = append(args, "-ldflags=-X github.com/tetratelabs/wazero/internal/version.version="+v)
	} else {
		fmt.Fprintf(os.Stderr, "precompiling guests: %v\n", err)
	}
	args = append(args, "./testdata/precompile", "-dir", cacheDir())
	for _, p := range guests.paths {
		args = append(args, p)
	}
	cmd := exec.Command(goTool(), args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "precompiling guests (tests go on, slower): %v\n%s", err, b)
	}
}

func buildGuest(spec guestSpec, out string) error {
	args := []string{"build", "-trimpath", "-o", out}
	if !spec.command {
		args = append(args, "-buildmode=c-shared")
	}
	if spec.ldflags != "" {
		args = append(args, "-ldflags="+spec.ldflags)
	}
	args = append(args, "./"+filepath.ToSlash(spec.dir))
	cmd := exec.Command(goTool(), args...)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// goTool is the go command on PATH, which CI and developers have.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go" // fails with a clear "executable file not found"
}

// guestPath builds the guests on first use and returns the module's path.
func guestPath(t testing.TB, name string) string {
	t.Helper()
	guests.once.Do(buildGuests)
	if err := guests.errs[name]; err != nil {
		t.Fatalf("building guest %s: %v", name, err)
	}
	p, ok := guests.paths[name]
	if !ok {
		t.Fatalf("no guest %s", name)
	}
	return p
}

func guestBytes(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(guestPath(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testConfig is the host configuration of most tests: generous deadlines
// so a loaded CI machine does not fail good calls, and under the race
// detector the compilation cache that precompile filled.
// PROXYPOOL_WASM_TEST_INTERPRETER=1 runs the suite on wazero's interpreter.
func testConfig() wasm.Config {
	cfg := wasm.Config{
		Interpreter: os.Getenv("PROXYPOOL_WASM_TEST_INTERPRETER") != "",
		CallTimeout: 20 * time.Second,
		InitTimeout: 30 * time.Second,
	}
	if raceEnabled && !cfg.Interpreter {
		cfg.CacheDir = cacheDir()
	}
	return cfg
}

func newHost(t testing.TB, cfg wasm.Config) *wasm.Host {
	t.Helper()
	h, err := wasm.NewHost(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// keeper holds one loaded adapter per guest for the whole test binary:
// compiled code is shared by reference count, so while it lives every
// other Load of the same module is a cache hit instead of a compilation.
var keeper struct {
	mu   sync.Mutex
	host *wasm.Host
	keep map[string]*wasm.Adapter
	errs map[string]error
	once map[string]*sync.Once
}

func keep(t testing.TB, name string) {
	t.Helper()
	keeper.mu.Lock()
	if keeper.host == nil {
		h, err := wasm.NewHost(context.Background(), testConfig())
		if err != nil {
			keeper.mu.Unlock()
			t.Fatal(err)
		}
		keeper.host, keeper.keep, keeper.errs, keeper.once = h, map[string]*wasm.Adapter{}, map[string]error{}, map[string]*sync.Once{}
	}
	o := keeper.once[name]
	if o == nil {
		o = new(sync.Once)
		keeper.once[name] = o
	}
	h := keeper.host
	keeper.mu.Unlock()
	o.Do(func() {
		a, err := h.Load(name, guestBytes(t, name))
		keeper.mu.Lock()
		defer keeper.mu.Unlock()
		if err != nil {
			keeper.errs[name] = err // shared reports it; load tries again
			return
		}
		keeper.keep[name] = a
	})
}

// shared returns the binary-wide adapter of a guest, loaded with
// testConfig, for tests that neither close it nor count its instances.
func shared(t testing.TB, name string) *wasm.Adapter {
	t.Helper()
	keep(t, name)
	keeper.mu.Lock()
	a := keeper.keep[name]
	keeper.mu.Unlock()
	if a == nil {
		t.Fatalf("loading %s: %v", name, keeper.errs[name])
	}
	return a
}

// load loads a guest on h; the adapter is closed when the test ends.
func load(t testing.TB, h *wasm.Host, name string) *wasm.Adapter {
	t.Helper()
	keep(t, name)
	a, err := h.Load(name, guestBytes(t, name))
	if err != nil {
		t.Fatalf("loading %s: %v", name, err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}
