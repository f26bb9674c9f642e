package suite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a process gets to exit after SIGTERM before it is
// killed.
const stopGrace = 10 * time.Second

// Procs tracks every process the suite starts, so each is stopped by its
// PID whatever happens.
type Procs struct {
	dir string // per-process logs go here
	log io.Writer

	mu   sync.Mutex
	live []*Proc
}

// NewProcs logs process starts and stops to log and keeps each process's
// stderr in dir/<name>.log.
func NewProcs(dir string, log io.Writer) *Procs { return &Procs{dir: dir, log: log} }

// Proc is one started process.
type Proc struct {
	Name string
	PID  int
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	logf *os.File
}

// StartOptions shape one process.
type StartOptions struct {
	// Stdout receives the process's standard output (nil: its log file).
	Stdout io.Writer
	Env    []string
	Dir    string
}

// Start starts args as name. The process gets SIGTERM if the suite itself
// dies (Pdeathsig), so nothing outlives a crashed runner.
func (ps *Procs) Start(name string, args []string, o StartOptions) (*Proc, error) {
	logf, err := os.Create(filepath.Join(ps.dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = logf
	cmd.Stdout = logf
	if o.Stdout != nil {
		cmd.Stdout = o.Stdout
	}
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.Dir = o.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, PID: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}), logf: logf}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.live = append(ps.live, p)
	ps.mu.Unlock()
	fmt.Fprintf(ps.log, "# started %s pid %d\n", name, p.PID)
	return p, nil
}

// Wait waits for the process to exit or ctx to end.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process's PID, waits up to stopGrace, then
// sends SIGKILL to the same PID.
func (ps *Procs) Stop(p *Proc) {
	if p == nil {
		return
	}
	if !p.Exited() {
		_ = syscall.Kill(p.PID, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
			<-p.done
		}
		fmt.Fprintf(ps.log, "# stopped %s pid %d\n", p.Name, p.PID)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i, q := range ps.live {
		if q == p {
			ps.live = append(ps.live[:i], ps.live[i+1:]...)
			break
		}
	}
}

// StopAll stops every live process, newest first.
func (ps *Procs) StopAll() {
	for {
		ps.mu.Lock()
		n := len(ps.live)
		var p *Proc
		if n > 0 {
			p = ps.live[n-1]
		}
		ps.mu.Unlock()
		if p == nil {
			return
		}
		ps.Stop(p)
	}
}

// firstLine starts a process and returns the first line it prints on
// stdout (the simulations announce their addresses that way); the rest
// of stdout goes to its log.
func (ps *Procs) firstLine(name string, args []string, timeout time.Duration) (*Proc, []byte, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p, err := ps.Start(name, args, StartOptions{Stdout: pw})
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, nil, err
	}
	type line struct {
		b   []byte
		err error
	}
	got := make(chan line, 1)
	go func() {
		defer pr.Close()
		br := bufio.NewReader(pr)
		b, err := br.ReadBytes('\n')
		got <- line{b, err}
		_, _ = io.Copy(io.Discard, br)
	}()
	select {
	case l := <-got:
		if l.err != nil {
			ps.Stop(p)
			return nil, nil, fmt.Errorf("starting %s: reading its announcement: %w (see %s.log)", name, l.err, name)
		}
		return p, l.b, nil
	case <-time.After(timeout):
		ps.Stop(p)
		return nil, nil, errors.New("starting " + name + ": no announcement in time")
	}
}
