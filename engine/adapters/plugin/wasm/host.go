package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Defaults and bounds of a Host.
const (
	// DefaultMemoryLimitPages caps an instance's linear memory: 1024 pages
	// of 64 KiB, 64 MiB.
	DefaultMemoryLimitPages = 1024
	// MaxMemoryLimitPages is the most Config.MemoryLimitPages may ask for
	// (1 GiB): a pool holds up to MaxInstances instances of this size.
	MaxMemoryLimitPages = 16384
	// DefaultCallTimeout bounds one call into a guest.
	DefaultCallTimeout = 2 * time.Second
	// DefaultInitTimeout bounds instantiation, which runs the guest's
	// _initialize (the Go runtime and package initialisers).
	DefaultInitTimeout = 10 * time.Second
	// defaultMaxInstancesCap caps the GOMAXPROCS-derived default pool size:
	// fetches are infrequent, and every instance holds its memory.
	defaultMaxInstancesCap = 8
	// MaxInstancesLimit bounds Config.MaxInstances.
	MaxInstancesLimit = 256
	// MaxModuleBytes bounds a module file. A Go module with encoding/json
	// weighs about 4 MB.
	MaxModuleBytes = 32 << 20
	// MaxInputBytes bounds the JSON document handed to a guest (params,
	// secrets, headers).
	MaxInputBytes = 1 << 20
	// MaxBodyBytes bounds a response body handed to a guest. The host's
	// fetch bounds bodies first (fetch.maxResponseBytes); this is the
	// backstop, sized so a body and its decoding fit the default memory
	// ceiling.
	MaxBodyBytes = 16 << 20
	// MaxOutputBytes bounds the JSON document a guest returns.
	MaxOutputBytes = 16 << 20
	// maxCapturedOutput bounds what is kept of a guest's stdout and stderr
	// per call, to quote in a crash error.
	maxCapturedOutput = 4 << 10
)

// Config tunes a Host. The zero value is the defaults.
type Config struct {
	// MemoryLimitPages caps each instance's linear memory, in 64 KiB
	// pages; 0 is DefaultMemoryLimitPages. A module declaring a larger
	// minimum fails to load; a guest growing past it gets an allocation
	// failure, which a Go guest reports as a fatal "out of memory".
	MemoryLimitPages uint32
	// CallTimeout bounds one call into a guest (0: DefaultCallTimeout).
	// The caller's context still applies when shorter.
	CallTimeout time.Duration
	// InitTimeout bounds instantiating a guest (0: DefaultInitTimeout).
	InitTimeout time.Duration
	// MaxInstances bounds the instances of one plugin, hence the calls it
	// runs at once (0: GOMAXPROCS, at most 8).
	MaxInstances int
	// CacheDir, when set, keeps compiled code on disk across restarts.
	// It must be private to the service (wazero trusts its content).
	// Empty: an in-memory cache shared by the hosts of the process.
	CacheDir string
	// Interpreter runs guests in wazero's interpreter instead of its
	// compiler: compiling is several times faster, calls are slower. For
	// tests, and for platforms without the compiler.
	Interpreter bool
}

func (c Config) withDefaults() (Config, error) {
	if c.MemoryLimitPages == 0 {
		c.MemoryLimitPages = DefaultMemoryLimitPages
	}
	if c.MemoryLimitPages > MaxMemoryLimitPages {
		return c, fmt.Errorf("memory limit of %d pages exceeds %d", c.MemoryLimitPages, MaxMemoryLimitPages)
	}
	if c.CallTimeout < 0 || c.InitTimeout < 0 {
		return c, errors.New("negative timeout")
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.InitTimeout == 0 {
		c.InitTimeout = DefaultInitTimeout
	}
	if c.MaxInstances < 0 || c.MaxInstances > MaxInstancesLimit {
		return c, fmt.Errorf("max instances %d out of range 0..%d", c.MaxInstances, MaxInstancesLimit)
	}
	if c.MaxInstances == 0 {
		c.MaxInstances = min(runtime.GOMAXPROCS(0), defaultMaxInstancesCap)
	}
	return c, nil
}

// sharedCache holds compiled code for every Host without a CacheDir, so a
// test or a CLI creating several hosts compiles each module once. Compiled
// code is reference-counted by wazero and freed with its last module.
var sharedCache = wazero.NewCompilationCache()

// Host runs WASM plugins: one wazero runtime, its WASI host module and the
// sandbox configuration every instance gets. It is safe for concurrent use.
type Host struct {
	cfg       Config
	rt        wazero.Runtime
	ownCache  wazero.CompilationCache // nil with the shared cache
	wasi      map[string]api.FunctionDefinition
	modConfig wazero.ModuleConfig
}

// NewHost starts a runtime with cfg.
func NewHost(ctx context.Context, cfg Config) (*Host, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("configuring wasm host: %w", err)
	}
	h := &Host{cfg: cfg}
	cache := sharedCache
	if cfg.CacheDir != "" {
		if h.ownCache, err = wazero.NewCompilationCacheWithDir(cfg.CacheDir); err != nil {
			return nil, fmt.Errorf("configuring wasm host: compilation cache: %w", err)
		}
		cache = h.ownCache
	}
	rc := wazero.NewRuntimeConfig()
	if cfg.Interpreter {
		rc = wazero.NewRuntimeConfigInterpreter()
	}
	rc = rc.WithCompilationCache(cache).
		WithMemoryLimitPages(cfg.MemoryLimitPages).
		WithCloseOnContextDone(true).
		// Crash errors quote the first line only; DWARF would cost load
		// time for stack traces nobody reads.
		WithDebugInfoEnabled(false)
	h.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, h.rt); err != nil {
		h.close(ctx)
		return nil, fmt.Errorf("configuring wasm host: instantiating wasi: %w", err)
	}
	h.wasi = h.rt.Module(wasiModule).ExportedFunctionDefinitions()
	// The sandbox: no WithFS/WithFSConfig (no preopened directory), no
	// WithEnv, no WithArgs, stdin left at wazero's empty reader; clocks
	// and output are set per instance. Random bytes are real: the ABI
	// grants them, and the Go runtime seeds map hashing with them.
	h.modConfig = wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(exportInitialize).
		WithRandSource(rand.Reader).
		WithOsyield(func() {})
	return h, nil
}

// Config returns the host's configuration, defaults applied.
func (h *Host) Config() Config { return h.cfg }

// Close stops the runtime: every adapter loaded by the host fails from
// then on.
func (h *Host) Close(ctx context.Context) error { return h.close(ctx) }

func (h *Host) close(ctx context.Context) error {
	err := h.rt.Close(ctx)
	if h.ownCache != nil {
		err = errors.Join(err, h.ownCache.Close(ctx))
	}
	return err
}

// Load compiles a module, checks that it implements ABI v1, instantiates it
// once (running its initialisers), checks its ABI version and reads its
// declaration. name is the plugin name, for messages. The adapter's
// instances are released by Close, or when the adapter becomes
// unreachable (a reload dropped it).
func (h *Host) Load(name string, module []byte) (*Adapter, error) {
	if len(module) > MaxModuleBytes {
		return nil, fmt.Errorf("loading wasm module: larger than %d bytes", MaxModuleBytes)
	}
	// Compiling runs no guest code; its time depends on the module's size
	// alone (MaxModuleBytes bounds it) and wazero does not interrupt it.
	cm, err := h.rt.CompileModule(context.Background(), module)
	if err != nil {
		return nil, fmt.Errorf("compiling wasm module: %w", err)
	}
	if err := checkModule(cm, h.wasi); err != nil {
		_ = cm.Close(context.Background())
		return nil, fmt.Errorf("checking wasm module: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.InitTimeout)
	defer cancel()
	p := newPool(h, cm)
	a, err := p.open(ctx, name)
	if err != nil {
		p.close()
		return nil, err
	}
	// The plugin package has no close hook: a generation replaced by a
	// reload is simply dropped. Tie the instances' lifetime to the
	// adapter's instead. The cleanup must not reference a itself.
	runtime.AddCleanup(a, func(p *pool) { p.close() }, p)
	return a, nil
}

var defaultHost struct {
	sync.Mutex
	cfg Config
	h   *Host
	err error
}

// SetDefaultConfig sets the configuration of the host that loads NAME.wasm
// files found by plugin.Load. It must run before the first load; after it,
// the configuration is fixed and this returns an error.
func SetDefaultConfig(cfg Config) error {
	if _, err := cfg.withDefaults(); err != nil {
		return fmt.Errorf("configuring wasm host: %w", err)
	}
	defaultHost.Lock()
	defer defaultHost.Unlock()
	if defaultHost.h != nil || defaultHost.err != nil {
		return errors.New("configuring wasm host: the default host is already running")
	}
	defaultHost.cfg = cfg
	return nil
}

// Default returns the process's host for the "wasm" kind, starting it on
// first use. It lives as long as the process.
func Default() (*Host, error) {
	defaultHost.Lock()
	defer defaultHost.Unlock()
	if defaultHost.h == nil && defaultHost.err == nil {
		defaultHost.h, defaultHost.err = NewHost(context.Background(), defaultHost.cfg)
	}
	return defaultHost.h, defaultHost.err
}

// Kind is the file extension of WASM plugins.
const Kind = "wasm"

func init() {
	plugin.RegisterKindOptions(Kind, loadKind, plugin.KindOptions{MaxFileBytes: MaxModuleBytes})
}

func loadKind(name string, data []byte) (upstream.Adapter, error) {
	h, err := Default()
	if err != nil {
		return nil, err
	}
	a, err := h.Load(name, data)
	if err != nil {
		return nil, err
	}
	return a, nil
}
