package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// missingBinary skips the test, or fails it when CI=true: on a developer
// machine a missing server is an inconvenience, in CI it means the image is
// broken and silently skipping would hide every test that needs it.
func missingBinary(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s", msg)
	}
	t.Skipf("%s", msg)
}

// tailBuffer keeps the last max bytes written to it, so a server's complaint
// can be shown when it fails to start without unbounded memory growth.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTailBuffer() *tailBuffer { return &tailBuffer{max: 16 << 10} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// process is a started child whose exit is observable through done, so
// waiting loops can give up as soon as the server dies instead of timing out.
type process struct {
	cmd  *exec.Cmd
	logs *tailBuffer
	done chan struct{}
	err  error // valid once done is closed
}

func startProcess(cmd *exec.Cmd, as *runAs) (*process, error) {
	logs := newTailBuffer()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := setChildAttrs(cmd, as); err != nil {
		return nil, fmt.Errorf("configuring %s: %w", cmd.Path, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	p := &process{cmd: cmd, logs: logs, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends sig and waits up to grace for the exit, then kills. It returns
// only once the process is gone (or clearly unkillable).
func (p *process) stop(sig os.Signal, grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err == nil {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return nil
		case <-timer.C:
		}
	}
	_ = p.cmd.Process.Kill()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("stopping pid %d: still running 10s after SIGKILL", p.cmd.Process.Pid)
	}
}

// waitReady polls check until it succeeds, the process exits, or timeout.
func (p *process) waitReady(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(25 * time.Millisecond)
	defer ticker.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		select {
		case <-p.done:
			return errors.Join(errors.New("exited before becoming ready"), p.err)
		case <-ticker.C:
		}
	}
}
