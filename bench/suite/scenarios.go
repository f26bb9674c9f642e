package suite

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/bench/loadgen"
)

// params size one suite.
type params struct {
	upstreams, upstreamProcs int
	// peak: a closed loop for closed, then open-loop steps at these
	// fractions of its rate, step long each; sustained means the rate was
	// achieved with no unsent work, under 0.1% errors and p99 <= p99Bound.
	closed, step time.Duration
	steps        []float64
	p99Bound     time.Duration
	// steady: open loop at steadyRate for steady.
	steadyRate float64
	steady     time.Duration
	// setup: a new tunnel per request for setup.
	setup time.Duration
	// tunnels held, each sending a request every tunnelInterval for
	// tunnelHold.
	tunnels                    int
	tunnelInterval, tunnelHold time.Duration
	// snapshot: grow the pool to snapshotProxies under load, waiting at
	// most snapshotWait.
	snapshotProxies int
	snapshotWait    time.Duration
	// snapshotCheckRate is checker.maxPerSecond during the growth (0:
	// unbounded).
	snapshotCheckRate float64
	// fault: vendor answers 500 from a third of the way in.
	fault time.Duration
	// profile: CPU profile of the gateway for this long (0: none).
	profile time.Duration
}

// The full suite asks for 10,000 tunnels; the tunnels scenario caps that
// to what the gateway's descriptor limit can hold and says so (see
// gatewayFDsPerTunnel and docs/benchmarks.md).
var (
	quickParams = params{
		upstreams: 20, upstreamProcs: 1,
		closed: 3 * time.Second, step: 3 * time.Second, steps: []float64{0.4, 0.7}, p99Bound: p99Bound,
		steadyRate: 10_000, steady: 3 * time.Second,
		setup:   3 * time.Second,
		tunnels: 500, tunnelInterval: time.Second, tunnelHold: 3 * time.Second,
		snapshotProxies: 2_000, snapshotWait: 15 * time.Second, snapshotCheckRate: 1000,
		fault: 6 * time.Second,
	}
	fullParams = params{
		upstreams: 20, upstreamProcs: 4,
		closed: 10 * time.Second, step: 10 * time.Second, steps: []float64{0.3, 0.5, 0.7, 0.85, 1.0}, p99Bound: p99Bound,
		steadyRate: 10_000, steady: 30 * time.Second,
		setup:   15 * time.Second,
		tunnels: 10_000, tunnelInterval: 5 * time.Second, tunnelHold: 30 * time.Second,
		snapshotProxies: 100_000, snapshotWait: 600 * time.Second, snapshotCheckRate: 1000,
		fault:   30 * time.Second,
		profile: 15 * time.Second,
	}
)

// p99Bound is the latency bound of "sustainable". It is loose because the
// figures come from a 2-core machine shared with other work, where the
// load average runs at 5-12 and run-queue waits of tens of milliseconds
// are the norm whatever the gateway does; on a dedicated host, tighten it.
const p99Bound = 100 * time.Millisecond

const (
	clients       = "64"
	responseBytes = 1024
	// capacityPeak and capacityUtilisation are seed 000 §17.1's defaults.
	capacityPeak        = 100_000
	capacityUtilisation = 0.60
)

func (r *Runner) runScenarios(ctx context.Context, p params) error {
	gw, err := r.startBase(ctx, p, p.upstreamProcs)
	if err != nil {
		return err
	}
	peak, peakRes, err := r.peak(ctx, p, gw)
	if err != nil {
		return err
	}
	if err := r.steady(ctx, p, gw, peak); err != nil {
		return err
	}
	if err := r.setupRate(ctx, p, gw); err != nil {
		return err
	}
	if err := r.https(ctx, p, gw); err != nil {
		return err
	}
	if err := r.fault(ctx, p, gw, peak); err != nil {
		return err
	}
	if err := r.tunnels(ctx, p, gw); err != nil {
		return err
	}
	r.ps.Stop(gw.Proc)
	if err := r.snapshot(ctx, p, peak); err != nil {
		return err
	}
	r.fig(Figure{Scenario: "worker-loss", Name: "failure-domain loss", NA: true,
		Note: "not applicable until the gRPC split: standalone runs one gateway worker in the controller's process"})
	r.fig(Figure{Scenario: "ctrl-loss", Name: "controller disconnect", NA: true,
		Note: "not applicable until the gRPC split: the controller is in-process, there is no session to lose"})
	r.capacity(peak, peakRes)
	if p.profile > 0 && r.o.PprofProxypool != "" {
		if err := r.profile(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// startGateway starts an appliance whose one upstream keeps between min
// and target proxies (target above what the vendor has keeps it
// fetching, so a vendor fault is noticed), and waits for min in its
// snapshot.
// startBase starts the simulations (the upstream proxies in procs
// processes, the vendor handing them out) and the gateway over them.
func (r *Runner) startBase(ctx context.Context, p params, procs int) (*Gateway, error) {
	sims, err := StartSims(r.ps, r.o.Sims, p.upstreams, procs)
	if err != nil {
		return nil, err
	}
	r.sims = sims
	if err := sims.SetVendorProxies(ctx, p.upstreams, ""); err != nil {
		return nil, err
	}
	return r.startGateway("gateway", p.upstreams, 2*p.upstreams, 0, r.o.Proxypool, nil)
}

func (r *Runner) startGateway(name string, minimum, target, estimated int, bin string, env []string) (*Gateway, error) {
	return StartGateway(r.ps, r.o.Dir, GatewayOptions{
		Name: name, Bin: bin, VendorURL: r.sims.Vendor,
		PoolMinimum: minimum, PoolTarget: target, PoolMaxSize: target,
		MaxConcurrency: 1000, EstimatedIPs: max(estimated, minimum),
		FetchInterval: time.Second, ProbeTarget: r.sims.Target, Env: env,
	}, minimum, 90*time.Second)
}

func (r *Runner) via(gw *Gateway) []string {
	return []string{"-x", "http://" + gw.Addr, "-sut-pid", strconv.Itoa(gw.Proc.PID)}
}

func (r *Runner) targetURL(n int) string {
	return "http://" + r.sims.Target + "/bytes/" + strconv.Itoa(n)
}

func dur(d time.Duration) string { return d.String() }

func rate(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

// failures are the operations that failed: errors other than work the
// schedule never sent (unsent) or the stop cut (cut).
func failures(res *loadgen.Result) int64 {
	return res.Errors() - res.Classes[loadgen.ClassUnsent] - res.Classes[loadgen.ClassCut]
}

// quietSeconds counts whole seconds of a run in which nothing succeeded
// (the last, partial second is left out).
func quietSeconds(res *loadgen.Result) int {
	n := 0
	for i, s := range res.Timeline {
		if i < len(res.Timeline)-1 && s.OK == 0 {
			n++
		}
	}
	return n
}

// slowSeconds counts seconds whose slowest success took over ms.
func slowSeconds(res *loadgen.Result, ms float64) int {
	n := 0
	for _, s := range res.Timeline {
		if s.MaxMS > ms {
			n++
		}
	}
	return n
}

func errRate(res *loadgen.Result) float64 {
	if res.Operations == 0 {
		return 0
	}
	return float64(res.Errors()) / float64(res.Operations)
}

// sustained says whether an open-loop run kept up with its schedule.
func sustained(res *loadgen.Result, target float64, bound time.Duration) bool {
	return res.Classes[loadgen.ClassUnsent] == 0 && res.Throughput >= 0.97*target &&
		errRate(res) < 0.001 && res.Latency.P99 <= float64(bound.Milliseconds())
}

func (r *Runner) sutFigures(scenario string, res *loadgen.Result) {
	if res.SUT == nil {
		return
	}
	r.fig(Figure{Scenario: scenario, Name: "gateway CPU (100% = one core)", Value: res.SUT.CPUPercent, Unit: "%"})
	r.fig(Figure{Scenario: scenario, Name: "gateway RSS max", Value: mib(res.SUT.RSSMaxBytes), Unit: "MiB"})
	r.fig(Figure{Scenario: scenario, Name: "gateway open fds max", Value: float64(res.SUT.FDsMax), Unit: "fds"})
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// peak finds the closed-loop maximum, then the highest open-loop rate
// sustained under the p99 bound.
func (r *Runner) peak(ctx context.Context, p params, gw *Gateway) (float64, *loadgen.Result, error) {
	closed, err := r.load(ctx, "peak-closed", append(r.via(gw), "-c", clients, "-d", dur(p.closed), r.targetURL(responseBytes))...)
	if err != nil {
		return 0, nil, err
	}
	r.fig(Figure{Scenario: "peak", Name: "closed loop, 64 clients: throughput", Value: closed.Throughput, Unit: "req/s", Note: "1 KiB responses, 20 upstreams"})
	r.fig(Figure{Scenario: "peak", Name: "closed loop: p50 / p99", Value: closed.Latency.P50, Unit: "ms", Note: fmt.Sprintf("p99 %.1f ms", closed.Latency.P99)})
	r.fig(Figure{Scenario: "peak", Name: "closed loop: errors", Value: float64(failures(closed)), Unit: "req"})
	best, bestRes := 0.0, (*loadgen.Result)(nil)
	for _, f := range p.steps {
		target := math.Floor(f * closed.Throughput)
		if target < 1 {
			continue
		}
		res, err := r.load(ctx, "peak-"+rate(target), append(r.via(gw), "-c", clients, "-rate", rate(target), "-d", dur(p.step), r.targetURL(responseBytes))...)
		if err != nil {
			return 0, nil, err
		}
		ok := sustained(res, target, p.p99Bound)
		verdict := "sustained"
		if !ok {
			verdict = fmt.Sprintf("NOT sustained (achieved %.0f/s, unsent %d, failed %d)", res.Throughput, res.Classes[loadgen.ClassUnsent], failures(res))
		}
		r.fig(Figure{Scenario: "peak", Name: fmt.Sprintf("open loop %.0f/s: p99", target), Value: res.Latency.P99, Unit: "ms", Note: verdict})
		if ok && target > best {
			best, bestRes = target, res
		}
	}
	note := fmt.Sprintf("highest open-loop step with p99 <= %s, < 0.1%% errors, nothing unsent", p.p99Bound)
	if bestRes == nil {
		note = "no step sustained: " + note
		bestRes = closed
	}
	r.fig(Figure{Scenario: "peak", Name: "peak sustainable rate", Value: best, Unit: "req/s", Note: note})
	r.sutFigures("peak", bestRes)
	if bestRes.SUT != nil && bestRes.SUT.CPUPercent > 0 && best > 0 {
		r.fig(Figure{Scenario: "peak", Name: "gateway CPU per 1,000 req/s", Value: bestRes.SUT.CPUPercent / (best / 1000), Unit: "% core"})
	}
	return best, bestRes, nil
}

// steady runs the 10k QPS schedule; when the machine cannot sustain it,
// it says so and runs the highest rate it can.
func (r *Runner) steady(ctx context.Context, p params, gw *Gateway, peak float64) error {
	res, err := r.load(ctx, "steady-10k", append(r.via(gw), "-c", clients, "-rate", rate(p.steadyRate), "-d", dur(p.steady), r.targetURL(responseBytes))...)
	if err != nil {
		return err
	}
	ok := sustained(res, p.steadyRate, p.p99Bound)
	note := "sustained"
	if !ok {
		note = fmt.Sprintf("NOT sustained on this machine: unsent %d, failed %d", res.Classes[loadgen.ClassUnsent], failures(res))
	}
	r.fig(Figure{Scenario: "steady-10k", Name: "achieved of 10,000 req/s open loop", Value: res.Throughput, Unit: "req/s", Note: note})
	r.fig(Figure{Scenario: "steady-10k", Name: "p99 (from intended send time)", Value: res.Latency.P99, Unit: "ms"})
	r.sutFigures("steady-10k", res)
	if ok || peak <= 0 {
		return nil
	}
	res, err = r.load(ctx, "steady-peak", append(r.via(gw), "-c", clients, "-rate", rate(peak), "-d", dur(p.steady), r.targetURL(responseBytes))...)
	if err != nil {
		return err
	}
	sc := "steady-max"
	r.fig(Figure{Scenario: sc, Name: "rate (highest sustained, stated)", Value: peak, Unit: "req/s"})
	r.fig(Figure{Scenario: sc, Name: "achieved", Value: res.Throughput, Unit: "req/s", Note: fmt.Sprintf("failed %d, unsent %d", failures(res), res.Classes[loadgen.ClassUnsent])})
	r.fig(Figure{Scenario: sc, Name: "p50", Value: res.Latency.P50, Unit: "ms"})
	r.fig(Figure{Scenario: sc, Name: "p99", Value: res.Latency.P99, Unit: "ms"})
	r.fig(Figure{Scenario: sc, Name: "p99.9", Value: res.Latency.P999, Unit: "ms"})
	r.fig(Figure{Scenario: sc, Name: "max", Value: res.Latency.Max, Unit: "ms"})
	r.sutFigures(sc, res)
	return nil
}

// setupRate opens a new tunnel per request: dial, CONNECT, 200, one
// request, close.
func (r *Runner) setupRate(ctx context.Context, p params, gw *Gateway) error {
	res, err := r.load(ctx, "setup-rate", append(r.via(gw), "-mode", "connect", "-c", clients, "-d", dur(p.setup), r.targetURL(responseBytes))...)
	if err != nil {
		return err
	}
	sc := "setup-rate"
	r.fig(Figure{Scenario: sc, Name: "new CONNECT tunnels per second", Value: res.Throughput, Unit: "/s", Note: "closed loop, 64 clients, 1 request per tunnel"})
	if res.Setup != nil {
		r.fig(Figure{Scenario: sc, Name: "setup (dial to 200) p50", Value: res.Setup.P50, Unit: "ms"})
		r.fig(Figure{Scenario: sc, Name: "setup p99", Value: res.Setup.P99, Unit: "ms"})
	}
	r.fig(Figure{Scenario: sc, Name: "errors", Value: float64(failures(res)), Unit: "req", Note: classNote(res)})
	r.sutFigures(sc, res)
	return nil
}

// https sends HTTPS requests through the gateway: each client opens one
// CONNECT tunnel and keeps its TLS connection to the target alive in it.
func (r *Runner) https(ctx context.Context, p params, gw *Gateway) error {
	res, err := r.load(ctx, "https", append(r.via(gw), "-c", clients, "-d", dur(p.setup), "-insecure",
		"https://"+r.sims.TLSTarget+"/bytes/"+strconv.Itoa(responseBytes))...)
	if err != nil {
		return err
	}
	sc := "https"
	r.fig(Figure{Scenario: sc, Name: "HTTPS through CONNECT, keep-alive: throughput", Value: res.Throughput, Unit: "req/s", Note: "closed loop, 64 clients, one tunnel and TLS session each"})
	r.fig(Figure{Scenario: sc, Name: "p99", Value: res.Latency.P99, Unit: "ms", Note: fmt.Sprintf("p50 %.1f ms", res.Latency.P50)})
	r.fig(Figure{Scenario: sc, Name: "errors", Value: float64(failures(res)), Unit: "req", Note: classNote(res)})
	r.sutFigures(sc, res)
	return nil
}

func classNote(res *loadgen.Result) string {
	s := ""
	for c, n := range res.Classes {
		if c != loadgen.ClassOK && n > 0 {
			s += fmt.Sprintf("%s=%d ", c, n)
		}
	}
	return s
}

// fault switches the vendor to HTTP 500 a third of the way into a steady
// run; the gateway must keep serving from the pool it has.
func (r *Runner) fault(ctx context.Context, p params, gw *Gateway, peak float64) error {
	rt := math.Max(math.Floor(peak/2), 200)
	before, err := gw.Metrics(ctx)
	if err != nil {
		return err
	}
	type out struct {
		res *loadgen.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := r.load(ctx, "provider-fault", append(r.via(gw), "-c", clients, "-rate", rate(rt), "-d", dur(p.fault), r.targetURL(responseBytes))...)
		done <- out{res, err}
	}()
	var o out
	select {
	case <-time.After(p.fault / 3):
		if err := r.sims.SetVendorMode(ctx, "error500"); err != nil {
			return err
		}
		o = <-done
	case o = <-done:
	}
	restoreErr := r.sims.SetVendorMode(ctx, "normal")
	if o.err != nil {
		return o.err
	}
	if restoreErr != nil {
		return restoreErr
	}
	after, err := gw.Metrics(ctx)
	if err != nil {
		return err
	}
	vendorErrors := sumMetric(after, "proxypool_provider_fetch_total", `outcome="error"`) - sumMetric(before, "proxypool_provider_fetch_total", `outcome="error"`)
	st, err := gw.Status(ctx)
	if err != nil {
		return err
	}
	sc := "provider-fault"
	res := o.res
	r.fig(Figure{Scenario: sc, Name: "vendor 500s seen by the controller", Value: vendorErrors, Unit: "calls", Note: fmt.Sprintf("vendor answered 500 for the last %s", p.fault-p.fault/3)})
	r.fig(Figure{Scenario: sc, Name: "served during the fault run", Value: res.Throughput, Unit: "req/s", Note: fmt.Sprintf("of %.0f/s open loop", rt)})
	r.fig(Figure{Scenario: sc, Name: "client errors", Value: float64(failures(res)), Unit: "req", Note: classNote(res)})
	r.fig(Figure{Scenario: sc, Name: "seconds without a successful request", Value: float64(quietSeconds(res)), Unit: "s", Note: fmt.Sprintf("of %d whole seconds", max(len(res.Timeline)-1, 0))})
	r.fig(Figure{Scenario: sc, Name: "p99", Value: res.Latency.P99, Unit: "ms"})
	r.fig(Figure{Scenario: sc, Name: "proxies in the snapshot after", Value: float64(st.Snapshot.Proxies), Unit: "proxies"})
	return nil
}

// runTunnels is the tunnels scenario on its own (suite "tunnels": the full
// suite's 10,000 without the rest of it).
func (r *Runner) runTunnels(ctx context.Context, p params) error {
	gw, err := r.startBase(ctx, p, p.upstreamProcs)
	if err != nil {
		return err
	}
	defer r.ps.Stop(gw.Proc)
	return r.tunnels(ctx, p, gw)
}

func checkRateNote(r float64) string {
	if r <= 0 {
		return "checks unpaced"
	}
	return fmt.Sprintf("checker.maxPerSecond %.0f", r)
}

// runSnapshot is the 100k snapshot scenario on its own (suite
// "snapshot"), loaded at Options.SnapshotRate.
func (r *Runner) runSnapshot(ctx context.Context, p params) error {
	sims, err := StartSims(r.ps, r.o.Sims, p.upstreams, p.upstreamProcs)
	if err != nil {
		return err
	}
	r.sims = sims
	rt := r.o.SnapshotRate
	if rt <= 0 {
		rt = 3500
	}
	if r.o.SnapshotCheckRate >= 0 {
		p.snapshotCheckRate = r.o.SnapshotCheckRate
	}
	return r.snapshot(ctx, p, 2*rt)
}

// tunnels holds many CONNECT tunnels with a little traffic each and
// reports what they cost the gateway. When the descriptor limit cannot
// hold the count asked for, it opens what fits and says so.
func (r *Runner) tunnels(ctx context.Context, p params, gw *Gateway) error {
	sc := "tunnels"
	k := p.tunnels
	if limit := r.report.Machine.NoFileMax; limit > 0 {
		if fit := int((limit - gatewayFDBase) / gatewayFDsPerTunnel); fit < k {
			k = fit
			r.fig(Figure{Scenario: sc, Name: fmt.Sprintf("%d tunnels held", p.tunnels), NA: true,
				Note: fmt.Sprintf("NOT POSSIBLE HERE: %d tunnels need %d sockets in the gateway alone (%d per tunnel), and this machine's hard descriptor limit is %d per process; %d asked, %d opened instead (%d kept for the rest of the gateway)",
					p.tunnels, p.tunnels*gatewayFDsPerTunnel, gatewayFDsPerTunnel, limit, p.tunnels, k, gatewayFDBase)})
		}
	}
	rssBefore, _ := loadgen.RSS(gw.Proc.PID)
	fdsBefore := countFDKinds(gw.Proc.PID)
	fdMax := make(chan fdKinds, 1)
	stopFDs := make(chan struct{})
	go func() { fdMax <- watchFDKinds(gw.Proc.PID, stopFDs) }()
	res, err := r.load(ctx, "tunnels", append(r.via(gw), "-mode", "tunnels", "-c", "128",
		"-tunnels", strconv.Itoa(k), "-tunnel-interval", dur(p.tunnelInterval), "-d", dur(p.tunnelHold),
		"-timeout", "30s", "-max-duration", dur(p.tunnelHold+3*time.Minute), r.targetURL(responseBytes))...)
	close(stopFDs)
	peakFDs := <-fdMax
	if err != nil {
		return err
	}
	r.fig(Figure{Scenario: sc, Name: "tunnels opened", Value: float64(res.TunnelsOpened), Unit: "", Note: fmt.Sprintf("of %d tried (%d asked); 128 setups in flight", k, p.tunnels)})
	r.fig(Figure{Scenario: sc, Name: "tunnel setup rate while opening", Value: res.SetupRate, Unit: "/s"})
	if res.Setup != nil {
		r.fig(Figure{Scenario: sc, Name: "setup p99", Value: res.Setup.P99, Unit: "ms"})
	}
	r.fig(Figure{Scenario: sc, Name: "tunnels still up after the hold", Value: float64(res.TunnelsHeld), Unit: "", Note: fmt.Sprintf("held %s, one 1 KiB request per tunnel every %s", p.tunnelHold, p.tunnelInterval)})
	r.fig(Figure{Scenario: sc, Name: "requests through held tunnels", Value: res.Throughput, Unit: "req/s", Note: fmt.Sprintf("p99 %.1f ms from intended time", res.Latency.P99)})
	r.fig(Figure{Scenario: sc, Name: "bytes through held tunnels", Value: res.BytesPerS / 1e6, Unit: "MB/s"})
	r.fig(Figure{Scenario: sc, Name: "errors", Value: float64(failures(res)), Unit: "", Note: classNote(res)})
	r.sutFigures(sc, res)
	if res.SUT != nil && res.TunnelsOpened > 0 {
		n := float64(res.TunnelsOpened)
		per := float64(res.SUT.RSSMaxBytes-rssBefore) / n
		r.fig(Figure{Scenario: sc, Name: "gateway RSS before the tunnels", Value: mib(rssBefore), Unit: "MiB"})
		r.fig(Figure{Scenario: sc, Name: "gateway RSS per held tunnel", Value: per / 1024, Unit: "KiB"})
		r.fig(Figure{Scenario: sc, Name: fmt.Sprintf("gateway RSS for %d tunnels", p.tunnels), Value: mib(rssBefore + int64(per*float64(p.tunnels))), Unit: "MiB",
			Note: fmt.Sprintf("RSS before + %d x RSS per held tunnel (measured over %d)", p.tunnels, res.TunnelsOpened)})
		r.fig(Figure{Scenario: sc, Name: "gateway descriptors per held tunnel", Value: float64(peakFDs.total-fdsBefore.total) / n, Unit: "fds",
			Note: fmt.Sprintf("sockets %.2f, pipes %.2f per tunnel (copy buffers, and pipes with gateway.tunnelSplice, are pooled and held only mid-burst)",
				float64(peakFDs.sockets-fdsBefore.sockets)/n, float64(peakFDs.pipes-fdsBefore.pipes)/n)})
	}
	return nil
}

// gatewayFDsPerTunnel is what one held tunnel costs the gateway in
// descriptors (the tunnels scenario measures it every run): the client and
// upstream sockets; engine/gateway/relay holds a pipe pair only while a
// burst is being copied, from a pool of at most relay.DefaultPipes.
// gatewayFDBase is the rest of the process (listeners, idle upstream
// connections, the checker, the relay's pipes) with headroom.
const (
	gatewayFDsPerTunnel = 2
	gatewayFDBase       = 600
)

// snapshot grows the pool from 20 proxies to snapshotProxies more under a
// steady load: the vendor switches to a list of that many proxies on the
// same 20 listeners, each with its own username. The unique key is
// (scheme, host, port, username, credential version), so every username
// is a distinct proxy to the pool, the checker and the snapshot, while
// the simulated upstreams (which require no credentials) carry the
// traffic of all of them.
func (r *Runner) snapshot(ctx context.Context, p params, peak float64) error {
	n := p.snapshotProxies
	if err := r.sims.SetVendorProxies(ctx, p.upstreams, ""); err != nil {
		return err
	}
	// With the pprof build at hand the full suite also profiles the
	// growth: CPU while it runs, the heap once it is over.
	bin, pprofAddr := r.o.Proxypool, ""
	var env []string
	if r.o.PprofProxypool != "" && p.profile > 0 {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		bin, pprofAddr, env = r.o.PprofProxypool, ports[0], []string{pprofEnv + "=" + ports[0]}
	}
	gw, err := StartGateway(r.ps, r.o.Dir, GatewayOptions{
		Name: "gateway-snapshot", Bin: bin, VendorURL: r.sims.Vendor, Env: env,
		// One call's worth of headroom: the controller does not start a
		// call that could overshoot maxSize.
		PoolMinimum: p.upstreams, PoolTarget: n + p.upstreams + 1000, PoolMaxSize: n + p.upstreams + 1000,
		MaxConcurrency: 1000, EstimatedIPs: 1000, FetchInterval: 100 * time.Millisecond, FetchInFlight: 4,
		CheckInFlight: 256, ProbeTarget: r.sims.Target, CheckPerSecond: p.snapshotCheckRate,
	}, p.upstreams, 90*time.Second)
	if err != nil {
		return err
	}
	defer r.ps.Stop(gw.Proc)
	rt := math.Max(math.Floor(peak/2), 200)
	base, err := r.load(ctx, "snapshot-baseline", append(r.via(gw), "-c", clients, "-rate", rate(rt), "-d", dur(p.step), r.targetURL(responseBytes))...)
	if err != nil {
		return err
	}
	before, err := gw.Metrics(ctx)
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	type out struct {
		res *loadgen.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := r.loadUntil(ctx, stop, "snapshot-update", append(r.via(gw), "-c", clients, "-rate", rate(rt),
			"-d", dur(p.snapshotWait+10*time.Second), "-max-duration", dur(p.snapshotWait+time.Minute), r.targetURL(responseBytes))...)
		done <- out{res, err}
	}()
	start := time.Now()
	if err := r.sims.SetVendorProxies(ctx, n, "u"); err != nil {
		close(stop)
		<-done
		return err
	}
	cpuPath := filepath.Join(r.o.Dir, "snapshot.cpu.pprof")
	profiled := make(chan error, 1)
	if pprofAddr != "" {
		go func() {
			profiled <- fetchProfile(ctx, cpuProfileURL(pprofAddr, 2*p.profile), cpuPath, 2*p.profile+time.Minute)
		}()
	} else {
		profiled <- nil
	}
	// The vendor's new list replaces the 20 plain proxies: the snapshot
	// ends with the n new ones.
	waitErr := gw.WaitProxies(ctx, n, p.snapshotWait)
	took := time.Since(start)
	st, _ := gw.Status(ctx)
	// A few more seconds of load on the full snapshot, then stop.
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
	}
	close(stop)
	o := <-done
	perr := <-profiled
	if o.err != nil {
		return o.err
	}
	if perr != nil {
		return perr
	}
	heapPath := filepath.Join(r.o.Dir, "snapshot.heap.pprof")
	if pprofAddr != "" {
		if err := fetchProfile(ctx, heapProfileURL(pprofAddr), heapPath, time.Minute); err != nil {
			return err
		}
	}
	after, err := gw.Metrics(ctx)
	if err != nil {
		return err
	}
	sc := "snapshot-100k"
	reached := fmt.Sprintf("reached %d proxies", st.Snapshot.Proxies)
	if waitErr != nil {
		reached = "NOT reached in time: " + waitErr.Error()
	}
	r.fig(Figure{Scenario: sc, Name: fmt.Sprintf("time to %d proxies in the snapshot", n), Value: took.Seconds(), Unit: "s", Note: reached + "; fetch 1000/call, 4 in flight, 256 checks in flight, " + checkRateNote(p.snapshotCheckRate)})
	publishes := sumMetric(after, "proxypool_distribution_publish_duration_seconds_count") - sumMetric(before, "proxypool_distribution_publish_duration_seconds_count")
	pubSum := sumMetric(after, "proxypool_distribution_publish_duration_seconds_sum") - sumMetric(before, "proxypool_distribution_publish_duration_seconds_sum")
	r.fig(Figure{Scenario: sc, Name: "snapshot publishes during the growth", Value: publishes, Unit: ""})
	if publishes > 0 {
		r.fig(Figure{Scenario: sc, Name: "mean publish (build + apply)", Value: 1000 * pubSum / publishes, Unit: "ms"})
	}
	res := o.res
	r.fig(Figure{Scenario: sc, Name: "p99 before (20 proxies)", Value: base.Latency.P99, Unit: "ms", Note: fmt.Sprintf("open loop %.0f/s", rt)})
	r.fig(Figure{Scenario: sc, Name: "p99 during growth and after", Value: res.Latency.P99, Unit: "ms", Note: fmt.Sprintf("p99.9 %.1f ms, max %.1f ms", res.Latency.P999, res.Latency.Max)})
	r.fig(Figure{Scenario: sc, Name: "served during growth", Value: res.Throughput, Unit: "req/s", Note: fmt.Sprintf("of %.0f/s", rt)})
	r.fig(Figure{Scenario: sc, Name: "seconds whose slowest request took over 1 s", Value: float64(slowSeconds(res, 1000)), Unit: "s", Note: fmt.Sprintf("of %d; seconds without a success: %d", len(res.Timeline), quietSeconds(res))})
	r.fig(Figure{Scenario: sc, Name: "errors during growth", Value: float64(failures(res)), Unit: "req", Note: classNote(res)})
	{
		h := res.Host
		r.fig(Figure{Scenario: sc, Name: "SYN retransmits during growth (host)", Value: float64(h.SynRetrans), Unit: "",
			Note: fmt.Sprintf("listen overflows %d, listen drops %d, time-wait overflows %d; a retransmitted SYN waits 1 s, then 2, 4, 8", h.ListenOverflows, h.ListenDrops, h.TimeWaitOverflow)})
	}
	r.sutFigures(sc, res)
	if pprofAddr != "" {
		if err := r.summarise(ctx, "profile-snap", cpuPath, "CPU"); err != nil {
			return err
		}
		return r.summarise(ctx, "profile-snap", heapPath, "heap")
	}
	return nil
}

// capacity works seed 000 §17.1's formula out with the measured rate.
func (r *Runner) capacity(peak float64, res *loadgen.Result) {
	if peak <= 0 {
		r.fig(Figure{Scenario: "capacity", Name: "worker replicas for 100k QPS", NA: true, Note: "no sustained rate measured"})
		return
	}
	replicas := math.Ceil(capacityPeak/(peak*capacityUtilisation)) + 1
	r.fig(Figure{Scenario: "capacity", Name: "workers for 100k QPS at 60% (measured rate)", Value: replicas, Unit: "", Note: fmt.Sprintf("ceil(100000/(%.0f*0.6)) + 1 failure domain; this machine's shared 2 cores", peak)})
	if res != nil && res.SUT != nil && res.SUT.CPUPercent > 0 {
		perCore := peak / (res.SUT.CPUPercent / 100)
		worker := 2 * perCore
		replicas := math.Ceil(capacityPeak/(worker*capacityUtilisation)) + 1
		r.fig(Figure{Scenario: "capacity", Name: "gateway req/s per CPU-second", Value: perCore, Unit: "req/s", Note: fmt.Sprintf("%.0f req/s at %.0f%% of one core", peak, res.SUT.CPUPercent)})
		r.fig(Figure{Scenario: "capacity", Name: "workers for 100k QPS at 60% (2 dedicated cores)", Value: replicas, Unit: "", Note: fmt.Sprintf("ceil(100000/(%.0f*0.6)) + 1, assuming linear scaling to 2 cores", worker)})
	}
}
