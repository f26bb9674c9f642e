package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// pool is the bounded set of instances of one compiled module. Each
// instance serves one call at a time: a Go guest has a single thread and
// wazero modules are not safe for concurrent calls.
type pool struct {
	h  *Host
	cm wazero.CompiledModule
	// slots holds one token per live instance, busy or idle; its capacity
	// is the pool's bound.
	slots chan struct{}
	idle  chan *instance

	mu     sync.Mutex // guards closed against put
	closed bool

	created, discarded atomic.Uint64
}

func newPool(h *Host, cm wazero.CompiledModule) *pool {
	return &pool{
		h:     h,
		cm:    cm,
		slots: make(chan struct{}, h.cfg.MaxInstances),
		idle:  make(chan *instance, h.cfg.MaxInstances),
	}
}

// instance is one instantiated module with its sandbox state.
type instance struct {
	mod   api.Module
	mem   api.Memory
	fns   map[string]api.Function
	clock *guestClock
	out   *capBuffer
}

// get returns an idle instance, instantiates one when the pool has room,
// or waits for one to be returned.
func (p *pool) get(ctx context.Context) (*instance, error) {
	select {
	case in := <-p.idle:
		return in, nil
	default:
	}
	select {
	case in := <-p.idle:
		return in, nil
	case p.slots <- struct{}{}:
		in, err := p.instantiate(ctx)
		if err != nil {
			<-p.slots
			return nil, err
		}
		return in, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a wasm instance: %w", ctx.Err())
	}
}

// put returns a healthy instance. An instance whose memory grew past half
// the ceiling is closed instead, so one huge response does not keep its
// memory pinned in the pool.
func (p *pool) put(in *instance) {
	if uint64(in.mem.Size()) > uint64(p.h.cfg.MemoryLimitPages)*65536/2 {
		p.discard(in)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.discardLocked(in)
		return
	}
	select {
	case p.idle <- in:
	default: // cannot happen: idle has room for every slot
		p.discardLocked(in)
	}
}

func (p *pool) discard(in *instance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discardLocked(in)
}

func (p *pool) discardLocked(in *instance) {
	_ = in.mod.Close(context.Background())
	p.discarded.Add(1)
	<-p.slots
}

// close releases the idle instances and the compiled code; busy instances
// are closed when they come back. It is idempotent.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for {
		select {
		case in := <-p.idle:
			p.discardLocked(in)
		default:
			_ = p.cm.Close(context.Background())
			return
		}
	}
}

func (p *pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *pool) instantiate(ctx context.Context) (*instance, error) {
	if p.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, p.h.cfg.InitTimeout)
	defer cancel()
	in := &instance{clock: &guestClock{}, out: &capBuffer{max: maxCapturedOutput}}
	cfg := p.h.modConfig.
		WithStdout(in.out).
		WithStderr(in.out).
		WithWalltime(in.clock.walltime, 1).
		WithNanotime(in.clock.nanotime, 1).
		WithNanosleep(in.clock.sleep)
	mod, err := p.h.rt.InstantiateModule(ctx, p.cm, cfg)
	if err != nil {
		if mod != nil {
			_ = mod.Close(context.Background())
		}
		return nil, fmt.Errorf("instantiating wasm module: %w", describeFailure(ctx, err, in.out))
	}
	in.mod = mod
	in.mem = mod.Memory()
	in.fns = make(map[string]api.Function, len(requiredExports))
	for _, e := range requiredExports {
		in.fns[e.name] = mod.ExportedFunction(e.name)
	}
	p.created.Add(1)
	return in, nil
}

// call runs one export on a pooled instance. Each input is written into a
// buffer from proxypool_alloc and passed as a (ptr, len) pair; an empty
// input is passed as (0, 0) without allocating. The output is copied out,
// released with proxypool_free and handed to decode. An instance that
// failed in any way, or whose output decode calls malformed, is discarded.
func (p *pool) call(ctx context.Context, now time.Time, export string, inputs [][]byte, decode func([]byte) error) error {
	in, err := p.get(ctx)
	if err != nil {
		return err
	}
	callCtx, cancel := context.WithTimeout(ctx, p.h.cfg.CallTimeout)
	defer cancel()
	in.clock.reset(now)
	in.out.Reset()
	out, err := in.invoke(callCtx, export, inputs)
	if err == nil {
		err = decode(out)
		if errors.Is(err, ErrBadOutput) {
			p.discard(in)
			return err
		}
		p.put(in)
		return err
	}
	p.discard(in)
	return err
}

// invoke is the ABI's calling sequence. Every failure names the export.
func (in *instance) invoke(ctx context.Context, export string, inputs [][]byte) ([]byte, error) {
	args := make([]uint64, 0, 2*len(inputs))
	for _, input := range inputs {
		if len(input) == 0 {
			args = append(args, 0, 0)
			continue
		}
		res, err := in.fns[exportAlloc].Call(ctx, uint64(len(input)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", exportAlloc, describeFailure(ctx, err, in.out))
		}
		ptr := uint32(res[0])
		if ptr == 0 || !in.mem.Write(ptr, input) {
			return nil, fmt.Errorf("%s: %w: returned %#x for %d bytes, memory is %d bytes", exportAlloc, ErrBadOutput, ptr, len(input), in.mem.Size())
		}
		args = append(args, uint64(ptr), uint64(len(input)))
	}
	res, err := in.fns[export].Call(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", export, describeFailure(ctx, err, in.out))
	}
	ptr, n, err := unpackOutput(res[0], in.mem.Size(), MaxOutputBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", export, ErrBadOutput, err)
	}
	view, _ := in.mem.Read(ptr, n) // in range: checked by unpackOutput
	out := bytes.Clone(view)
	if _, err := in.fns[exportFree].Call(ctx, uint64(ptr), uint64(n)); err != nil {
		return nil, fmt.Errorf("%s: %w", exportFree, describeFailure(ctx, err, in.out))
	}
	return out, nil
}

// unpackOutput splits an i64 result into the output's pointer and length,
// checking both against the memory size and the output bound.
func unpackOutput(packed uint64, memSize, limit uint32) (ptr, n uint32, err error) {
	if packed == 0 {
		return 0, 0, errors.New("returned no output")
	}
	ptr, n = uint32(packed>>32), uint32(packed)
	if n > limit {
		return 0, 0, fmt.Errorf("output of %d bytes, more than %d", n, limit)
	}
	if uint64(ptr)+uint64(n) > uint64(memSize) {
		return 0, 0, fmt.Errorf("output at %#x+%d lies outside memory of %d bytes", ptr, n, memSize)
	}
	if n == 0 {
		return 0, 0, errors.New("returned an empty output")
	}
	return ptr, n, nil
}

// describeFailure turns an error of a call into the guest into ErrGuestTimeout
// or ErrGuestCrashed, quoting what the guest printed.
func describeFailure(ctx context.Context, err error, out *capBuffer) error {
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return fmt.Errorf("%w: %w", ErrGuestTimeout, context.DeadlineExceeded)
		case sys.ExitCodeContextCanceled:
			// The caller gave up: not the guest's fault.
			return fmt.Errorf("call cancelled: %w", context.Canceled)
		}
		if msg := out.summary(); msg != "" {
			return fmt.Errorf("%w: exited with code %d: %s", ErrGuestCrashed, exit.ExitCode(), msg)
		}
		return fmt.Errorf("%w: exited with code %d", ErrGuestCrashed, exit.ExitCode())
	}
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(ctxErr, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrGuestTimeout, ctxErr)
	}
	// A trap: wazero's message is "wasm error: <cause>" followed by a
	// stack trace, which says nothing to an operator.
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if s := out.summary(); s != "" {
		msg += ": " + s
	}
	return fmt.Errorf("%w: %s", ErrGuestCrashed, sanitize(msg, 512))
}

// guestClock is what a guest sees of time: the wall clock reads the time
// the host passed for the call, and the monotonic clock is a counter that
// advances 1µs per read and by the requested duration per sleep, so a
// sleeping guest neither blocks the host nor learns the real time.
type guestClock struct {
	wall atomic.Int64 // unix nanoseconds
	mono atomic.Int64
}

func (c *guestClock) reset(now time.Time) { c.wall.Store(now.UnixNano()) }

func (c *guestClock) walltime() (sec int64, nsec int32) {
	ns := c.wall.Load()
	return ns / 1e9, int32(ns % 1e9)
}

func (c *guestClock) nanotime() int64 { return c.mono.Add(1000) }

func (c *guestClock) sleep(ns int64) {
	if ns > 0 {
		c.mono.Add(ns)
	}
}

// capBuffer keeps the first max bytes written to it: a Go guest prints the
// panic message first and the goroutine dump after.
type capBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (c *capBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *capBuffer) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b = c.b[:0]
}

// summary is the first paragraph of the captured output, at most two
// lines: for a Go guest, the panic or fatal error message without the
// goroutine dump that follows it.
func (c *capBuffer) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(string(c.b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			if len(lines) > 0 {
				break
			}
			continue
		}
		if lines = append(lines, l); len(lines) == 2 {
			break
		}
	}
	return sanitize(strings.Join(lines, " | "), 256)
}
