package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// GatewayOptions shape the appliance under test. The pool and check
// settings are the only ones a scenario changes; everything else is the
// shipped default, so the figures are those of an unturned appliance.
type GatewayOptions struct {
	Name      string // process and directory name
	Bin       string
	VendorURL string
	// PoolMinimum/Target/MaxSize of the one upstream; MaxConcurrency per
	// proxy.
	PoolMinimum, PoolTarget, PoolMaxSize int
	MaxConcurrency                       int
	// FetchInterval and FetchInFlight pace the vendor calls; EstimatedIPs
	// sizes each call (the vendor hands out at most 1000).
	FetchInterval time.Duration
	FetchInFlight int
	EstimatedIPs  int
	// CheckInFlight bounds concurrent health checks; ProbeTarget is where
	// the BASIC check CONNECTs through each proxy.
	CheckInFlight int
	ProbeTarget   string
	// CheckPerSecond is checker.maxPerSecond (0: no bound).
	CheckPerSecond float64
	MaxConns       int
	// Env adds to the process environment (the profiling build reads
	// PROXYPOOL_BENCH_PPROF).
	Env []string
}

// Gateway is a running appliance.
type Gateway struct {
	Proc              *Proc
	Addr, Dist, Admin string // host:port
	client            *http.Client
	configPath        string
}

var gatewayConfig = template.Must(template.New("gw").Parse(`# Written by bench/suite for one benchmark run.
listeners:
  gateway: {{.Addr}}
  distribution: {{.Dist}}
  admin: {{.Admin}}
stateDir: {{.State}}
pluginsDir: {{.Plugins}}
log:
  level: warn
gateway:
  limits:
    maxConns: {{.O.MaxConns}}
upstreams:
  - name: bench
    provider:
      plugin: json-envelope
      params:
        url: {{.O.VendorURL}}/v1/proxies
    fetch:
      requestInterval: {{.O.FetchInterval}}
      maxInFlight: {{.O.FetchInFlight}}
      estimatedIPsPerCall: {{.O.EstimatedIPs}}
    pool:
      minimum: {{.O.PoolMinimum}}
      target: {{.O.PoolTarget}}
      maxSize: {{.O.PoolMaxSize}}
      defaultTTL: 1h
      maxConcurrency: {{.O.MaxConcurrency}}
    check:
      interval: 10m
      timeout: 5s
      maxInFlight: {{.O.CheckInFlight}}
      probeTarget: {{.O.ProbeTarget}}
checker:
  maxPerSecond: {{.O.CheckPerSecond}}
extraction:
  maxCount: 1000
# Every server of the benchmark is on loopback.
security:
  allowLoopbackDestinations: true
`))

// StartGateway writes a config under dir, starts bin/proxypool and waits
// until its snapshot holds want proxies (at most wait).
func StartGateway(ps *Procs, dir string, o GatewayOptions, want int, wait time.Duration) (*Gateway, error) {
	if o.FetchInterval == 0 {
		o.FetchInterval = time.Second
	}
	o.FetchInFlight = max(o.FetchInFlight, 1)
	o.EstimatedIPs = max(o.EstimatedIPs, 20)
	o.CheckInFlight = max(o.CheckInFlight, 64)
	if o.MaxConns == 0 {
		o.MaxConns = 10000
	}
	gdir := filepath.Join(dir, o.Name)
	if err := os.MkdirAll(filepath.Join(gdir, "state"), 0o750); err != nil {
		return nil, fmt.Errorf("gateway directory: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		Addr: ports[0], Dist: ports[1], Admin: ports[2],
		client:     &http.Client{Timeout: 10 * time.Second},
		configPath: filepath.Join(gdir, "proxypool.yaml"),
	}
	plugins, err := filepath.Abs("plugins")
	if err != nil {
		return nil, err
	}
	f, err := os.Create(g.configPath)
	if err != nil {
		return nil, fmt.Errorf("writing gateway config: %w", err)
	}
	err = gatewayConfig.Execute(f, map[string]any{
		"Addr": g.Addr, "Dist": g.Dist, "Admin": g.Admin, "State": filepath.Join(gdir, "state"),
		"Plugins": plugins, "O": o,
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing gateway config: %w", err)
	}
	if g.Proc, err = ps.Start(o.Name, []string{o.Bin, "run", "--config", g.configPath}, StartOptions{Env: o.Env}); err != nil {
		return nil, err
	}
	if err := g.WaitProxies(context.Background(), want, wait); err != nil {
		ps.Stop(g.Proc)
		return nil, err
	}
	return g, nil
}

// Status is the part of /v1/admin/status the suite reads.
type Status struct {
	Ready    bool           `json:"ready"`
	Proxies  map[string]int `json:"proxies"`
	Snapshot struct {
		Version int64 `json:"version"`
		Proxies int   `json:"proxies"`
	} `json:"snapshot"`
}

// Status reads the admin status.
func (g *Gateway) Status(ctx context.Context) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Admin+"/v1/admin/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return st, fmt.Errorf("reading gateway status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("reading gateway status: %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("reading gateway status: %w", err)
	}
	return st, nil
}

// WaitProxies polls until the published snapshot holds at least n
// proxies, the process exits, or wait passes.
func (g *Gateway) WaitProxies(ctx context.Context, n int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := -1
	for {
		if g.Proc.Exited() {
			return fmt.Errorf("gateway %s exited while starting (see its log)", g.Proc.Name)
		}
		if st, err := g.Status(ctx); err == nil {
			last = st.Snapshot.Proxies
			if st.Ready && last >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gateway: snapshot holds %d proxies after %s, want %d", last, wait, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Metrics scrapes /metrics into "name{labels}" -> value.
func (g *Gateway) Metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping gateway metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseMetrics(io.LimitReader(resp.Body, 64<<20))
}

// parseMetrics reads the Prometheus text format's samples.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return out, nil
}

// sumMetric adds every sample of name whose labels contain all of
// labels ("k=\"v\"" fragments).
func sumMetric(m map[string]float64, name string, labels ...string) float64 {
	var s float64
	for k, v := range m {
		base, rest, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
				break
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// freePorts reserves n loopback ports by listening on them together (so
// they differ), then releases them for the child to bind.
func freePorts(n int) ([]string, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	out := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}
