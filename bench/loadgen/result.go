package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// Result is everything a run measured. JSON field names are stable: the
// benchmark runner and docs/benchmarks.md read them.
type Result struct {
	Scenario    string    `json:"scenario"`
	Mode        Mode      `json:"mode"`
	URL         string    `json:"url"`
	Proxy       string    `json:"proxy,omitempty"`
	Method      string    `json:"method"`
	Concurrency int       `json:"concurrency"`
	TargetRate  float64   `json:"target_rate,omitempty"`
	Start       time.Time `json:"start"`
	Elapsed     float64   `json:"elapsed_seconds"`
	// Stopped says which bound ended the run: requests, duration,
	// max-duration or canceled.
	Stopped string `json:"stopped"`

	Operations int64           `json:"operations"`
	OK         int64           `json:"ok"`
	Classes    map[Class]int64 `json:"classes"`
	Throughput float64         `json:"ops_per_sec"` // successful operations per second
	Bytes      int64           `json:"bytes"`       // response bytes received
	BytesPerS  float64         `json:"bytes_per_sec"`
	// Latency is of successful operations; Corrected says it is measured
	// from the intended send time (open loop).
	Latency   Quantiles `json:"latency"`
	Corrected bool      `json:"corrected"`
	// Setup is the CONNECT setup latency (dial to 200) in connect and
	// tunnels modes; SetupRate the tunnels established per second while
	// tunnels mode was opening them.
	Setup         *Quantiles `json:"setup,omitempty"`
	SetupRate     float64    `json:"setup_per_sec,omitempty"`
	Tunnels       int        `json:"tunnels,omitempty"` // asked for
	TunnelEvery   float64    `json:"tunnel_interval_seconds,omitempty"`
	TunnelsOpened int        `json:"tunnels_opened,omitempty"`
	TunnelsHeld   int        `json:"tunnels_held,omitempty"` // still up at the end
	// ProxiesReturned sums the "returned" of extract answers.
	ProxiesReturned int64 `json:"proxies_returned,omitempty"`

	// Timeline is the run second by second (http, connect and extract
	// modes), by completion time.
	Timeline []Second `json:"timeline,omitempty"`

	Loadgen GoStats    `json:"loadgen"`
	SUT     *ProcStats `json:"sut,omitempty"`
	Host    HostStats  `json:"host"`
}

// GoStats is the load generator's own Go runtime at the end of the run.
type GoStats struct {
	HeapAllocBytes uint64  `json:"heap_alloc_bytes"`
	SysBytes       uint64  `json:"sys_bytes"`
	NumGC          uint32  `json:"num_gc"`
	PauseTotalMS   float64 `json:"gc_pause_total_ms"`
	GCCPUFraction  float64 `json:"gc_cpu_fraction"`
	Goroutines     int     `json:"goroutines"`
	CPUSeconds     float64 `json:"cpu_seconds"` // user+system of this process
}

func goStats() GoStats {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	g := GoStats{
		HeapAllocBytes: m.HeapAlloc, SysBytes: m.Sys, NumGC: m.NumGC,
		PauseTotalMS: float64(m.PauseTotalNs) / 1e6, GCCPUFraction: m.GCCPUFraction,
		Goroutines: runtime.NumGoroutine(),
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		g.CPUSeconds = tv(ru.Utime) + tv(ru.Stime)
	}
	return g
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// Errors sums every class but ok.
func (r *Result) Errors() int64 {
	var n int64
	for c, v := range r.Classes {
		if c != ClassOK {
			n += v
		}
	}
	return n
}

// WriteJSON writes the result as one indented JSON document.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing result: %w", err)
	}
	return nil
}

// WriteTable writes the result for people.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	row("scenario", "%s", r.Scenario)
	via := "direct"
	if r.Proxy != "" {
		via = "via " + r.Proxy
	}
	row("mode", "%s %s %s (%s)", r.Mode, r.Method, r.URL, via)
	load := fmt.Sprintf("%d workers, closed loop", r.Concurrency)
	switch {
	case r.Mode == ModeTunnels && r.TunnelEvery > 0:
		load = fmt.Sprintf("%d tunnels (%d setups in flight), a request through each every %gs", r.Tunnels, r.Concurrency, r.TunnelEvery)
	case r.Mode == ModeTunnels:
		load = fmt.Sprintf("%d tunnels (%d setups in flight), requests back to back", r.Tunnels, r.Concurrency)
	case r.TargetRate > 0:
		load = fmt.Sprintf("%d workers, open loop at %.0f/s", r.Concurrency, r.TargetRate)
	}
	row("load", "%s; %.1fs, stopped by %s", load, r.Elapsed, r.Stopped)
	row("operations", "%d, ok %d, errors %d%s", r.Operations, r.OK, r.Errors(), classList(r.Classes))
	row("throughput", "%.1f ok/s, %s/s received", r.Throughput, human(r.BytesPerS))
	from := "from actual send"
	if r.Corrected {
		from = "from intended send (corrected for coordinated omission)"
	}
	row("latency", "%s; %s", quantLine(r.Latency), from)
	if r.Setup != nil {
		row("setup", "%s", quantLine(*r.Setup))
	}
	if r.Mode == ModeTunnels {
		row("tunnels", "%d opened at %.1f/s, %d held at the end", r.TunnelsOpened, r.SetupRate, r.TunnelsHeld)
	}
	if r.Mode == ModeExtract {
		row("extracted", "%d proxies", r.ProxiesReturned)
	}
	g := r.Loadgen
	row("loadgen", "cpu %.1fs, heap %s, sys %s, %d GCs (pause %.1fms, %.2f%% cpu), %d goroutines",
		g.CPUSeconds, human(float64(g.HeapAllocBytes)), human(float64(g.SysBytes)), g.NumGC, g.PauseTotalMS, 100*g.GCCPUFraction, g.Goroutines)
	if s := r.SUT; s != nil {
		row("sut", "pids %v (%d processes): cpu %.0f%% avg, %.0f%% max (100%% = one core), rss %s (max %s), fds %d (max %d), threads max %d",
			s.PIDs, s.Processes, s.CPUPercent, s.CPUPercentMax, human(float64(s.RSSBytes)), human(float64(s.RSSMaxBytes)), s.FDs, s.FDsMax, s.ThreadsMax)
		if s.Error != "" {
			row("sut error", "%s", s.Error)
		}
	}
	h := r.Host
	row("host", "loopback %s/s, tcp in use max %d, time-wait max %d, load1 %.2f -> %.2f",
		human(h.LoopbackBytesPerSec), h.TCPInUseMax, h.TCPTimeWaitMax, h.Load1Start, h.Load1End)
	row("tcp", "listen overflows %d, listen drops %d, syn retransmits %d, time-wait overflows %d",
		h.ListenOverflows, h.ListenDrops, h.SynRetrans, h.TimeWaitOverflow)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing result: %w", err)
	}
	return nil
}

func quantLine(q Quantiles) string {
	if q.Count == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (n=%d)",
		ms(q.P50), ms(q.P90), ms(q.P99), ms(q.P999), ms(q.Max), q.Count)
}

func ms(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.3fms", v)
}

func classList(c map[Class]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if k != ClassOK && c[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, " ") + ")"
}

// human prints a byte count with a binary unit.
func human(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", b, units[i])
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
