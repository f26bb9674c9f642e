package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/proxypool/proxypool/bench/loadgen"
)

// Options configure a suite run.
type Options struct {
	// Suite is quick (CI, under a minute), full, tunnels or snapshot (one
	// scenario of the full suite alone) or peers.
	Suite string
	// Dir receives configs, process logs, results and profiles.
	Dir string
	// Binaries: the appliance, the load generator, the simulations, and
	// optionally the appliance built with net/http/pprof (profiles are
	// taken only when set).
	Proxypool, Loadgen, Sims, PprofProxypool string
	// Out receives one line per figure; Log the progress.
	Out, Log io.Writer
	// PeersOnly, for the peers suite, names the comparisons to run (any
	// of http, connect, bulk); empty runs all three. PeersRounds, if
	// positive, replaces the default 5 rounds.
	PeersOnly   []string
	PeersRounds int
	// SnapshotRate is the load of the snapshot suite, req/s (the full
	// suite uses half the peak it measured; default 3,500).
	SnapshotRate float64
	// SnapshotCheckRate, when not negative, replaces the snapshot suite's
	// checker.maxPerSecond (0: unbounded).
	SnapshotCheckRate float64
}

// Figure is one measured (or stated) number.
type Figure struct {
	Scenario string  `json:"scenario"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Note     string  `json:"note,omitempty"`
	// NA marks a scenario that cannot be measured here (Note says why).
	NA bool `json:"na,omitempty"`
}

// Report is what a suite run writes to Dir/<suite>.json.
type Report struct {
	Suite   string            `json:"suite"`
	Start   time.Time         `json:"start"`
	Machine Machine           `json:"machine"`
	Figures []Figure          `json:"figures"`
	Results []*loadgen.Result `json:"results"`
}

// Machine describes where the figures were taken.
type Machine struct {
	NProc     int     `json:"nproc"`
	CPU       string  `json:"cpu"`
	Go        string  `json:"go"`
	Kernel    string  `json:"kernel"`
	MemTotal  string  `json:"mem_total"`
	Load1     float64 `json:"load1_at_start"`
	NoFileMax uint64  `json:"nofile_hard_limit"`
}

// Runner runs one suite.
type Runner struct {
	o    Options
	ps   *Procs
	sims *Sims

	mu     sync.Mutex
	report Report
}

// Run runs the suite o.Suite and writes its report. Every process it
// started is stopped before it returns, also when ctx is canceled.
func Run(ctx context.Context, o Options) error {
	if err := os.MkdirAll(o.Dir, 0o750); err != nil {
		return fmt.Errorf("bench directory: %w", err)
	}
	r := &Runner{o: o, ps: NewProcs(o.Dir, o.Log)}
	defer r.ps.StopAll()
	r.report = Report{Suite: o.Suite, Start: time.Now(), Machine: describeMachine()}
	m := r.report.Machine
	fmt.Fprintf(o.Out, "# suite %s on %d× %s, %s, kernel %s, load1 %.2f at start, nofile hard limit %d\n",
		o.Suite, m.NProc, m.CPU, m.Go, m.Kernel, m.Load1, m.NoFileMax)
	var err error
	switch o.Suite {
	case "quick":
		err = r.runScenarios(ctx, quickParams)
	case "full":
		err = r.runScenarios(ctx, fullParams)
	case "tunnels":
		err = r.runTunnels(ctx, fullParams)
	case "snapshot":
		err = r.runSnapshot(ctx, fullParams)
	case "peers":
		p := peersParams
		if o.PeersRounds > 0 {
			p.rounds = o.PeersRounds
		}
		if len(o.PeersOnly) > 0 {
			p.only = map[string]bool{}
			for _, k := range o.PeersOnly {
				if k != "http" && k != "connect" && k != "bulk" {
					return fmt.Errorf("peers comparison %q: want http, connect or bulk", k)
				}
				p.only[k] = true
			}
		}
		err = r.runPeers(ctx, p)
	default:
		err = fmt.Errorf("unknown suite %q: want quick, full, tunnels, snapshot or peers", o.Suite)
	}
	if werr := r.writeReport(); err == nil {
		err = werr
	}
	return err
}

func (r *Runner) writeReport() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := json.MarshalIndent(r.report, "", "  ")
	if err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	path := filepath.Join(r.o.Dir, r.o.Suite+".json")
	if err := os.WriteFile(path, b, 0o640); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	fmt.Fprintf(r.o.Out, "# report: %s\n", path)
	return nil
}

// fig records and prints one figure.
func (r *Runner) fig(f Figure) {
	r.mu.Lock()
	r.report.Figures = append(r.report.Figures, f)
	r.mu.Unlock()
	val := fmtValue(f.Value)
	if f.NA {
		val = "n/a"
	}
	note := ""
	if f.Note != "" {
		note = "  " + f.Note
	}
	fmt.Fprintf(r.o.Out, "%-14s %-44s %12s %-6s%s\n", f.Scenario, f.Name, val, f.Unit, note)
}

func fmtValue(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10 || v <= -10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// load runs bin/proxy-loadgen as its own process and returns its result.
func (r *Runner) load(ctx context.Context, scenario string, args ...string) (*loadgen.Result, error) {
	return r.loadUntil(ctx, nil, scenario, args...)
}

// loadUntil is load that is stopped early when stop closes: SIGINT to the
// load generator's PID, on which it stops and reports what it measured.
func (r *Runner) loadUntil(ctx context.Context, stop <-chan struct{}, scenario string, args ...string) (*loadgen.Result, error) {
	var out bytes.Buffer
	argv := append([]string{r.o.Loadgen, "-json", "-scenario", scenario}, args...)
	p, err := r.ps.Start("loadgen-"+scenario, argv, StartOptions{Stdout: &out})
	if err != nil {
		return nil, err
	}
	if stop != nil {
		go func() {
			select {
			case <-stop:
				_ = syscall.Kill(p.PID, syscall.SIGINT)
			case <-p.done:
			}
		}()
	}
	werr := p.Wait(ctx)
	r.ps.Stop(p)
	if werr != nil {
		return nil, fmt.Errorf("load %s: %w (see %s)", scenario, werr, filepath.Join(r.o.Dir, p.Name+".log"))
	}
	var res loadgen.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("load %s: reading its result: %w", scenario, err)
	}
	r.mu.Lock()
	r.report.Results = append(r.report.Results, &res)
	r.mu.Unlock()
	fmt.Fprintf(r.o.Log, "# %s: %.0f ok/s, p99 %.2fms, errors %d, elapsed %.1fs\n",
		scenario, res.Throughput, res.Latency.P99, res.Errors(), res.Elapsed)
	return &res, nil
}

func describeMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				m.MemTotal = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscanf(string(b), "%f", &m.Load1)
	}
	m.NoFileMax = noFileHardLimit()
	return m
}
