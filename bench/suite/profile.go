package suite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Profiles list this many functions: the project's own (engine/) by
// cumulative share, then the process's heaviest by flat share.
const (
	profileEngineTop = 8
	profileFlatTop   = 4
)

// profile runs the closed-loop load against the pprof build of the
// appliance and takes a CPU profile of it meanwhile.
func (r *Runner) profile(ctx context.Context, p params) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	gw, err := r.startGateway("gateway-pprof", p.upstreams, 2*p.upstreams, 0, r.o.PprofProxypool,
		[]string{pprofEnv + "=" + ports[0]})
	if err != nil {
		return err
	}
	defer r.ps.Stop(gw.Proc)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := r.loadUntil(ctx, stop, "profile-load", append(r.via(gw), "-c", clients, "-d", dur(p.profile+10*time.Second), r.targetURL(responseBytes))...)
		done <- err
	}()
	path := filepath.Join(r.o.Dir, "gateway.cpu.pprof")
	perr := fetchProfile(ctx, cpuProfileURL(ports[0], p.profile), path, p.profile+30*time.Second)
	close(stop)
	if err := <-done; err != nil {
		return err
	}
	if perr != nil {
		return perr
	}
	return r.summarise(ctx, "profile-http", path, "CPU")
}

// pprofEnv names the loopback address bench/pprof serves profiles on.
const pprofEnv = "PROXYPOOL_BENCH_PPROF"

func cpuProfileURL(addr string, d time.Duration) string {
	return "http://" + addr + "/debug/pprof/profile?seconds=" + strconv.Itoa(int(d.Seconds()))
}

func heapProfileURL(addr string) string {
	return "http://" + addr + "/debug/pprof/heap?gc=1"
}

// summarise turns a saved profile into figures (the project's functions
// by cumulative share, the heaviest overall by flat share) and keeps the
// full text next to it.
func (r *Runner) summarise(ctx context.Context, scenario, path, what string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		r.fig(Figure{Scenario: scenario, Name: what + " profile", NA: true, Note: "saved to " + path + "; no go tool to summarise it"})
		return nil
	}
	top := func(args ...string) ([]byte, error) {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, goBin, append(append([]string{"tool", "pprof"}, args...), r.o.PprofProxypool, path)...)
		cmd.Stdout, cmd.Stderr = &out, io.Discard
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("summarising %s: %w", path, err)
		}
		return out.Bytes(), nil
	}
	cum, err := top("-top", "-cum", "-nodecount=400")
	if err != nil {
		return err
	}
	flat, err := top("-top", "-nodecount=60")
	if err != nil {
		return err
	}
	_ = os.WriteFile(strings.TrimSuffix(path, ".pprof")+".top.txt", append(flat, cum...), 0o640)
	n := 0
	for _, e := range parseTop(cum, 400) {
		if n == profileEngineTop {
			break
		}
		if strings.Contains(e.fn, "/proxypool/engine/") {
			r.fig(Figure{Scenario: scenario, Name: shortFn(e.fn), Value: e.cum, Unit: "% cum", Note: what + ", engine functions by cumulative share"})
			n++
		}
	}
	for _, e := range parseTop(flat, profileFlatTop) {
		r.fig(Figure{Scenario: scenario, Name: shortFn(e.fn), Value: e.flat, Unit: "% flat", Note: what + ", heaviest overall"})
	}
	fmt.Fprintf(r.o.Out, "# %s profile: %s (go tool pprof -top %s %s)\n", what, path, r.o.PprofProxypool, path)
	return nil
}

// shortFn drops the module path from a function name.
func shortFn(fn string) string {
	return strings.TrimPrefix(fn, "github.com/proxypool/proxypool/")
}

func fetchProfile(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("taking profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("taking profile: %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("taking profile: %w", err)
	}
	return os.WriteFile(path, b, 0o640)
}

type topEntry struct {
	fn        string
	flat, cum float64
}

// parseTop reads `go tool pprof -top` lines:
//
//	flat  flat%   sum%        cum   cum%
//	1.20s 12.00% 12.00%      2.10s 21.00%  runtime.futex
func parseTop(b []byte, n int) []topEntry {
	var out []topEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	header := false
	for sc.Scan() && len(out) < n {
		f := strings.Fields(sc.Text())
		if !header {
			header = len(f) >= 5 && f[0] == "flat" && f[1] == "flat%"
			continue
		}
		if len(f) < 6 {
			continue
		}
		flat, err1 := strconv.ParseFloat(strings.TrimSuffix(f[1], "%"), 64)
		cum, err2 := strconv.ParseFloat(strings.TrimSuffix(f[4], "%"), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, topEntry{fn: strings.Join(f[5:], " "), flat: flat, cum: cum})
	}
	return out
}
