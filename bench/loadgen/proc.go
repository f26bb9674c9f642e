package loadgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// procRoot is where the proc file system is mounted; tests point it at a
// fixture tree.
var procRoot = "/proc"

// maxProcScan bounds the processes looked at to find descendants.
const maxProcScan = 100_000

// procStat is what one /proc/<pid>/stat line tells.
type procStat struct {
	PPID    int
	Ticks   uint64 // utime + stime, in clock ticks
	Threads int
}

// parseStat parses /proc/<pid>/stat. The command name is parenthesised
// and may itself contain spaces and parentheses, so fields are counted
// from the last ')'.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("parsing stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 18 {
		return procStat{}, fmt.Errorf("parsing stat: %d fields after the command name, want at least 18", len(f))
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseUint(f[11], 10, 64)
	st, err3 := strconv.ParseUint(f[12], 10, 64)
	th, err4 := strconv.Atoi(f[17])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return procStat{}, fmt.Errorf("parsing stat: %w", err)
	}
	return procStat{PPID: ppid, Ticks: ut + st, Threads: th}, nil
}

// parseVmRSS returns VmRSS of /proc/<pid>/status in bytes (0 for kernel
// threads and zombies, which have none).
func parseVmRSS(b []byte) (int64, error) {
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("parsing status: VmRSS line %q", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing status: VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	return 0, nil
}

// parseLoopback returns the received bytes of interface lo in
// /proc/net/dev (every byte sent on loopback is also received on it).
func parseLoopback(b []byte) (int64, error) {
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 1 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing net/dev: lo: %w", err)
		}
		return n, nil
	}
	return 0, errors.New("parsing net/dev: no lo interface")
}

// sockstat is the TCP line of /proc/net/sockstat.
type sockstat struct{ InUse, TimeWait int }

func parseSockstat(b []byte) (sockstat, error) {
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "TCP:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		var s sockstat
		for i := 0; i+1 < len(f); i += 2 {
			n, err := strconv.Atoi(f[i+1])
			if err != nil {
				return sockstat{}, fmt.Errorf("parsing sockstat: %s: %w", f[i], err)
			}
			switch f[i] {
			case "inuse":
				s.InUse = n
			case "tw":
				s.TimeWait = n
			}
		}
		return s, nil
	}
	return sockstat{}, errors.New("parsing sockstat: no TCP line")
}

// tcpExt are the TcpExt counters of /proc/net/netstat that explain a
// latency tail on loopback: a full accept queue drops SYNs, whose
// retransmission waits 1 s, then 2 s, 4 s...; a full TIME-WAIT table
// drops that state.
type tcpExt struct {
	ListenOverflows, ListenDrops, SynRetrans, TimeWaitOverflow int64
}

func parseNetstat(b []byte) (tcpExt, error) {
	var names []string
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "TcpExt:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if names == nil {
			names = f
			continue
		}
		if len(f) != len(names) {
			return tcpExt{}, fmt.Errorf("parsing netstat: %d TcpExt values for %d names", len(f), len(names))
		}
		var e tcpExt
		for i, name := range names {
			var dst *int64
			switch name {
			case "ListenOverflows":
				dst = &e.ListenOverflows
			case "ListenDrops":
				dst = &e.ListenDrops
			case "TCPSynRetrans":
				dst = &e.SynRetrans
			case "TCPTimeWaitOverflow":
				dst = &e.TimeWaitOverflow
			default:
				continue
			}
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				return tcpExt{}, fmt.Errorf("parsing netstat: %s: %w", name, err)
			}
			*dst = n
		}
		return e, nil
	}
	return tcpExt{}, errors.New("parsing netstat: no TcpExt lines")
}

// parseLoadavg returns the 1-minute load average of /proc/loadavg.
func parseLoadavg(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, errors.New("parsing loadavg: empty")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parsing loadavg: %w", err)
	}
	return v, nil
}

// atClkTck is the auxiliary vector entry carrying USER_HZ.
const atClkTck = 17

// parseClkTck finds AT_CLKTCK in an auxiliary vector of 64-bit
// little-endian pairs; 0 when absent.
func parseClkTck(auxv []byte) uint64 {
	for i := 0; i+16 <= len(auxv); i += 16 {
		k := binary.LittleEndian.Uint64(auxv[i:])
		v := binary.LittleEndian.Uint64(auxv[i+8:])
		if k == 0 {
			break
		}
		if k == atClkTck {
			return v
		}
	}
	return 0
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times; 100 on
// every Linux this runs on, read from the auxiliary vector to be sure.
func clockTicks() float64 {
	if b, err := os.ReadFile(procRoot + "/self/auxv"); err == nil {
		if v := parseClkTck(b); v > 0 {
			return float64(v)
		}
	}
	return 100
}

func readProc(pid int) (procStat, int64, int, error) {
	dir := procRoot + "/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procStat{}, 0, 0, fmt.Errorf("reading process %d: %w", pid, err)
	}
	st, err := parseStat(b)
	if err != nil {
		return procStat{}, 0, 0, fmt.Errorf("reading process %d: %w", pid, err)
	}
	var rss int64
	if b, err := os.ReadFile(dir + "/status"); err == nil {
		rss, _ = parseVmRSS(b)
	}
	return st, rss, countFDs(dir + "/fd"), nil
}

// countFDs counts open descriptors; -1 when not permitted.
func countFDs(dir string) int {
	f, err := os.Open(dir)
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(4096)
		n += len(names)
		if err != nil {
			return n
		}
	}
}

// descendants returns roots plus every process descended from them.
func descendants(roots []int) []int {
	children := map[int][]int{}
	d, err := os.Open(procRoot)
	if err != nil {
		return roots
	}
	names, _ := d.Readdirnames(maxProcScan)
	d.Close()
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(procRoot + "/" + name + "/stat")
		if err != nil {
			continue
		}
		if st, err := parseStat(b); err == nil {
			children[st.PPID] = append(children[st.PPID], pid)
		}
	}
	seen := map[int]bool{}
	out := make([]int, 0, len(roots))
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		out = append(out, pid)
		queue = append(queue, children[pid]...)
	}
	return out
}

// ProcStats are the system under test's figures over a run. CPU percent
// counts one core as 100.
type ProcStats struct {
	PIDs          []int   `json:"pids"`
	Processes     int     `json:"processes"`
	CPUSeconds    float64 `json:"cpu_seconds"`
	CPUPercent    float64 `json:"cpu_percent"`
	CPUPercentMax float64 `json:"cpu_percent_max"`
	RSSBytes      int64   `json:"rss_bytes"`
	RSSMaxBytes   int64   `json:"rss_max_bytes"`
	FDs           int     `json:"fds"`
	FDsMax        int     `json:"fds_max"`
	ThreadsMax    int     `json:"threads_max"`
	Samples       int     `json:"samples"`
	Error         string  `json:"error,omitempty"`
}

// HostStats are machine-wide figures over a run: every server of a
// benchmark is on loopback, so lo's bytes are the run's network traffic.
type HostStats struct {
	LoopbackBytes       int64   `json:"loopback_bytes"`
	LoopbackBytesPerSec float64 `json:"loopback_bytes_per_sec"`
	TCPInUseMax         int     `json:"tcp_inuse_max"`
	TCPTimeWaitMax      int     `json:"tcp_timewait_max"`
	// Deltas over the run of /proc/net/netstat's TcpExt counters.
	ListenOverflows  int64   `json:"listen_overflows"`
	ListenDrops      int64   `json:"listen_drops"`
	SynRetrans       int64   `json:"syn_retransmits"`
	TimeWaitOverflow int64   `json:"timewait_overflows"`
	Load1Start       float64 `json:"load1_start"`
	Load1End         float64 `json:"load1_end"`
}

// Sampler samples the system under test and the host every interval.
type Sampler struct {
	roots    []int
	tree     bool
	interval time.Duration
	hz       float64

	mu       sync.Mutex
	proc     ProcStats
	host     HostStats
	last     map[int]uint64 // pid -> ticks at the previous sample
	lastAt   time.Time
	first    time.Time
	loStart  int64
	loLast   int64
	loLastAt time.Time
	extStart tcpExt
	extLast  tcpExt
}

// NewSampler samples pids (and their descendants when tree is set).
func NewSampler(pids []int, tree bool, interval time.Duration) *Sampler {
	return &Sampler{roots: pids, tree: tree, interval: interval, hz: clockTicks(), last: map[int]uint64{}}
}

// Run samples until ctx ends, then takes a last sample.
func (s *Sampler) Run(ctx context.Context) {
	s.sample(true)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.sample(false)
			return
		case <-t.C:
			s.sample(false)
		}
	}
}

func (s *Sampler) sample(first bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sampleHost(now, first)
	if len(s.roots) == 0 {
		return
	}
	pids := s.roots
	if s.tree {
		pids = descendants(s.roots)
	}
	var ticks, delta uint64
	var rss int64
	fds, threads, alive := 0, 0, 0
	next := make(map[int]uint64, len(pids))
	for _, pid := range pids {
		st, r, n, err := readProc(pid)
		if err != nil {
			if s.proc.Error == "" && !first {
				s.proc.Error = err.Error()
			}
			continue
		}
		alive++
		next[pid] = st.Ticks
		ticks += st.Ticks
		// A process that appeared or exited between samples contributes
		// only what it used while both samples saw it.
		if prev, ok := s.last[pid]; ok && st.Ticks >= prev {
			delta += st.Ticks - prev
		}
		rss += r
		if n > 0 {
			fds += n
		}
		threads += st.Threads
	}
	if first {
		s.first = now
		s.proc.PIDs = append([]int(nil), s.roots...)
	} else if dt := now.Sub(s.lastAt).Seconds(); dt > 0 {
		cpu := float64(delta) / s.hz
		s.proc.CPUSeconds += cpu
		s.proc.CPUPercentMax = max(s.proc.CPUPercentMax, 100*cpu/dt)
		if span := now.Sub(s.first).Seconds(); span > 0 {
			s.proc.CPUPercent = 100 * s.proc.CPUSeconds / span
		}
	}
	s.last, s.lastAt = next, now
	s.proc.Samples++
	s.proc.Processes = max(s.proc.Processes, alive)
	s.proc.RSSBytes, s.proc.RSSMaxBytes = rss, max(s.proc.RSSMaxBytes, rss)
	s.proc.FDs, s.proc.FDsMax = fds, max(s.proc.FDsMax, fds)
	s.proc.ThreadsMax = max(s.proc.ThreadsMax, threads)
}

func (s *Sampler) sampleHost(now time.Time, first bool) {
	if b, err := os.ReadFile(procRoot + "/net/dev"); err == nil {
		if lo, err := parseLoopback(b); err == nil {
			if first {
				s.loStart = lo
			}
			s.loLast, s.loLastAt = lo, now
		}
	}
	if b, err := os.ReadFile(procRoot + "/net/sockstat"); err == nil {
		if ss, err := parseSockstat(b); err == nil {
			s.host.TCPInUseMax = max(s.host.TCPInUseMax, ss.InUse)
			s.host.TCPTimeWaitMax = max(s.host.TCPTimeWaitMax, ss.TimeWait)
		}
	}
	if b, err := os.ReadFile(procRoot + "/net/netstat"); err == nil {
		if e, err := parseNetstat(b); err == nil {
			if first {
				s.extStart = e
			}
			s.extLast = e
		}
	}
	if b, err := os.ReadFile(procRoot + "/loadavg"); err == nil {
		if l, err := parseLoadavg(b); err == nil {
			if first {
				s.host.Load1Start = l
			}
			s.host.Load1End = l
		}
	}
	if first && s.first.IsZero() {
		s.first = now
	}
}

// Stats returns the figures so far; proc is nil without pids to sample.
func (s *Sampler) Stats() (*ProcStats, HostStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.host
	h.LoopbackBytes = s.loLast - s.loStart
	h.ListenOverflows = s.extLast.ListenOverflows - s.extStart.ListenOverflows
	h.ListenDrops = s.extLast.ListenDrops - s.extStart.ListenDrops
	h.SynRetrans = s.extLast.SynRetrans - s.extStart.SynRetrans
	h.TimeWaitOverflow = s.extLast.TimeWaitOverflow - s.extStart.TimeWaitOverflow
	if span := s.loLastAt.Sub(s.first).Seconds(); span > 0 {
		h.LoopbackBytesPerSec = float64(h.LoopbackBytes) / span
	}
	if len(s.roots) == 0 {
		return nil, h
	}
	p := s.proc
	return &p, h
}

// RSS returns the resident set size of pid in bytes, from
// /proc/<pid>/status.
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("reading process %d: %w", pid, err)
	}
	return parseVmRSS(b)
}
