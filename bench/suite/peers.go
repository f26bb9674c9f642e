package suite

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"text/template"
	"time"

	"github.com/proxypool/proxypool/bench/loadgen"
)

// peersParams size the side-by-side comparison.
type peerParams struct {
	upstreams, rounds   int
	http, connect, bulk time.Duration
	bulkBytes           int
	only                map[string]bool // nil: every comparison
}

func (p peerParams) runs(what string) bool { return p.only == nil || p.only[what] }

var peersParams = peerParams{upstreams: 20, rounds: 5, http: 8 * time.Second, connect: 5 * time.Second, bulk: 5 * time.Second, bulkBytes: 16 << 20}

// Squid: parents in round-robin, nothing cached, never direct; the same
// 20 simulated upstreams the gateway uses. -N keeps it one foreground
// process (no SMP workers, no daemon) so its PID is the whole proxy.
var squidConfig = template.Must(template.New("squid").Parse(`# Written by bench/suite.
http_port {{.Addr}}
visible_hostname bench-squid
pid_filename {{.Dir}}/squid.pid
cache_log {{.Dir}}/cache.log
access_log none
cache_store_log none
logfile_rotate 0
coredump_dir {{.Dir}}
cache deny all
cache_mem 0 MB
http_access allow all
never_direct allow all
{{range $i, $a := .Parents}}cache_peer {{$a.Host}} parent {{$a.Port}} 0 no-query no-digest no-netdb-exchange round-robin name=up{{$i}}
{{end}}via off
forwarded_for delete
dns_nameservers 127.0.0.1
pinger_enable off
shutdown_lifetime 1 seconds
max_filedescriptors 16384
`))

// tinyproxy forwards to one upstream: its Upstream directive takes one
// default proxy (others only per destination domain), so it cannot
// spread over the 20 the way the gateway and Squid do.
var tinyproxyConfig = template.Must(template.New("tinyproxy").Parse(`# Written by bench/suite.
User {{.User}}
Group {{.Group}}
Port {{.Port}}
Listen {{.Host}}
Timeout 60
PidFile "{{.Dir}}/tinyproxy.pid"
LogFile "{{.Dir}}/tinyproxy.log"
LogLevel Error
MaxClients 1024
DisableViaHeader Yes
Upstream http {{.Upstream}}
`))

type hostPort struct {
	Host string
	Port int
}

func splitHostPort(a string) (hostPort, error) {
	u, err := url.Parse("http://" + a)
	if err != nil {
		return hostPort{}, err
	}
	p, err := strconv.Atoi(u.Port())
	return hostPort{u.Hostname(), p}, err
}

// peer is one system compared.
type peer struct {
	name  string
	proxy string // "" for direct
	pid   int
	tree  bool
}

func (r *Runner) runPeers(ctx context.Context, p peerParams) error {
	squidBin, err1 := exec.LookPath("squid")
	tinyBin, err2 := exec.LookPath("tinyproxy")
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("peers need squid and tinyproxy (make bench-peers installs them): %w", err)
	}
	sims, err := StartSims(r.ps, r.o.Sims, p.upstreams, 1)
	if err != nil {
		return err
	}
	r.sims = sims
	if err := sims.SetVendorProxies(ctx, p.upstreams, ""); err != nil {
		return err
	}
	gw, err := r.startGateway("gateway", p.upstreams, 2*p.upstreams, 0, r.o.Proxypool, nil)
	if err != nil {
		return err
	}
	squid, err := r.startSquid(ctx, squidBin)
	if err != nil {
		return err
	}
	tiny, err := r.startTinyproxy(ctx, tinyBin)
	if err != nil {
		return err
	}
	peers := []peer{
		{name: "direct", pid: sims.TargetPID},
		{name: "one-upstream", proxy: sims.Upstreams[0].Addr, pid: sims.UpstreamPIDs[0]},
		{name: "gateway", proxy: gw.Addr, pid: gw.Proc.PID},
		{name: "squid", proxy: squid.addr, pid: squid.proc.PID, tree: true},
		{name: "tinyproxy", proxy: tiny.addr, pid: tiny.proc.PID, tree: true},
	}
	fmt.Fprintf(r.o.Out, "# peers: %d rounds, each running every system in turn (A B C D E, A B C D E, ...); figures are medians\n", p.rounds)

	if p.runs("http") {
		if err := r.peersHTTP(ctx, p, peers); err != nil {
			return err
		}
	}
	// CONNECT setup: a new tunnel per request.
	connRes := map[string][]*loadgen.Result{}
	bulkRes := map[string][]*loadgen.Result{}
	for round := range p.rounds {
		for _, pe := range peers {
			if !p.runs("connect") {
				break
			}
			res, err := r.load(ctx, fmt.Sprintf("peers-connect-%s-%d", pe.name, round+1), r.peerArgs(pe,
				"-mode", "connect", "-c", clients, "-d", dur(p.connect), r.targetURL(responseBytes))...)
			if err != nil {
				return err
			}
			connRes[pe.name] = append(connRes[pe.name], res)
		}
		for _, pe := range peers {
			if !p.runs("bulk") {
				break
			}
			if pe.name == "tinyproxy" {
				continue // bulk is compared with Squid; tinyproxy would only lengthen the run
			}
			res, err := r.load(ctx, fmt.Sprintf("peers-bulk-%s-%d", pe.name, round+1), r.peerArgs(pe,
				"-mode", "tunnels", "-tunnels", "1", "-d", dur(p.bulk), "-timeout", "60s", r.targetURL(p.bulkBytes))...)
			if err != nil {
				return err
			}
			bulkRes[pe.name] = append(bulkRes[pe.name], res)
		}
	}
	gwConn := median(connRes["gateway"], func(x *loadgen.Result) float64 { return x.Throughput })
	for _, pe := range peers {
		rs, ok := connRes[pe.name]
		if !ok {
			continue
		}
		rate := median(rs, func(x *loadgen.Result) float64 { return x.Throughput })
		r.fig(Figure{Scenario: "peers-connect", Name: pe.name + ": new tunnels/s", Value: rate, Unit: "/s", Note: ratioNote(pe.name, gwConn, rate, "gateway/"+pe.name)})
		r.fig(Figure{Scenario: "peers-connect", Name: pe.name + ": setup p99", Value: median(rs, func(x *loadgen.Result) float64 {
			if x.Setup == nil {
				return 0
			}
			return x.Setup.P99
		}), Unit: "ms"})
	}
	gwBulk := median(bulkRes["gateway"], func(x *loadgen.Result) float64 { return x.BytesPerS })
	for _, pe := range peers {
		rs, ok := bulkRes[pe.name]
		if !ok {
			continue
		}
		v := median(rs, func(x *loadgen.Result) float64 { return x.BytesPerS })
		r.fig(Figure{Scenario: "peers-bulk", Name: pe.name + ": one tunnel, 16 MiB responses", Value: v / 1e6, Unit: "MB/s", Note: ratioNote(pe.name, gwBulk, v, "gateway/"+pe.name)})
	}
	return nil
}

// peersHTTP compares plain HTTP: 64 keep-alive clients, 1 KiB responses, closed loop.
func (r *Runner) peersHTTP(ctx context.Context, p peerParams, peers []peer) error {
	httpRes := map[string][]*loadgen.Result{}
	for round := range p.rounds {
		for _, pe := range peers {
			res, err := r.load(ctx, fmt.Sprintf("peers-http-%s-%d", pe.name, round+1), r.peerArgs(pe,
				"-c", clients, "-d", dur(p.http), r.targetURL(responseBytes))...)
			if err != nil {
				return err
			}
			httpRes[pe.name] = append(httpRes[pe.name], res)
		}
	}
	gwRate := median(httpRes["gateway"], func(x *loadgen.Result) float64 { return x.Throughput })
	gwP99 := median(httpRes["gateway"], func(x *loadgen.Result) float64 { return x.Latency.P99 })
	for _, pe := range peers {
		rs := httpRes[pe.name]
		sc := "peers-http"
		rate := median(rs, func(x *loadgen.Result) float64 { return x.Throughput })
		p99 := median(rs, func(x *loadgen.Result) float64 { return x.Latency.P99 })
		r.fig(Figure{Scenario: sc, Name: pe.name + ": req/s", Value: rate, Unit: "req/s", Note: ratioNote(pe.name, gwRate, rate, "gateway/"+pe.name+" throughput")})
		r.fig(Figure{Scenario: sc, Name: pe.name + ": p50", Value: median(rs, func(x *loadgen.Result) float64 { return x.Latency.P50 }), Unit: "ms"})
		r.fig(Figure{Scenario: sc, Name: pe.name + ": p99", Value: p99, Unit: "ms", Note: ratioNote(pe.name, gwP99, p99, "gateway/"+pe.name+" p99")})
		who := pe.name
		if pe.name == "direct" || pe.name == "one-upstream" {
			who = "simulation process"
		}
		r.fig(Figure{Scenario: sc, Name: pe.name + ": RSS max (" + who + ")", Value: median(rs, func(x *loadgen.Result) float64 {
			if x.SUT == nil {
				return 0
			}
			return mib(x.SUT.RSSMaxBytes)
		}), Unit: "MiB"})
		r.fig(Figure{Scenario: sc, Name: pe.name + ": CPU (" + who + ")", Value: median(rs, func(x *loadgen.Result) float64 {
			if x.SUT == nil {
				return 0
			}
			return x.SUT.CPUPercent
		}), Unit: "%", Note: "100% = one core"})
	}

	return nil
}

func (r *Runner) peerArgs(pe peer, args ...string) []string {
	out := []string{"-sut-pid", strconv.Itoa(pe.pid)}
	if pe.tree {
		out = append(out, "-sut-tree")
	}
	if pe.proxy != "" {
		out = append(out, "-x", "http://"+pe.proxy)
	}
	return append(out, args...)
}

func ratioNote(name string, gw, v float64, what string) string {
	if name == "gateway" || v == 0 {
		return ""
	}
	return fmt.Sprintf("%s = %.2f", what, gw/v)
}

func median(rs []*loadgen.Result, f func(*loadgen.Result) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	vs := make([]float64, len(rs))
	for i, x := range rs {
		vs[i] = f(x)
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

type peerProc struct {
	proc *Proc
	addr string
}

// ownedDir makes a directory the peer's unprivileged user can write
// (Squid and tinyproxy drop root for their configured user).
func ownedDir(dir, username string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	u, err := user.Lookup(username)
	if err != nil {
		return fmt.Errorf("looking up user %s: %w", username, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

func (r *Runner) startSquid(ctx context.Context, bin string) (*peerProc, error) {
	dir := filepath.Join(r.o.Dir, "squid")
	if err := ownedDir(dir, "proxy"); err != nil {
		return nil, fmt.Errorf("squid directory: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	var parents []hostPort
	for _, a := range r.sims.Addrs() {
		hp, err := splitHostPort(a)
		if err != nil {
			return nil, err
		}
		parents = append(parents, hp)
	}
	conf := filepath.Join(dir, "squid.conf")
	if err := writeTemplate(conf, squidConfig, map[string]any{"Addr": ports[0], "Dir": dir, "Parents": parents}); err != nil {
		return nil, err
	}
	p, err := r.ps.Start("squid", []string{bin, "-N", "-f", conf}, StartOptions{})
	if err != nil {
		return nil, err
	}
	pp := &peerProc{proc: p, addr: ports[0]}
	return pp, r.waitProxy(ctx, pp)
}

func (r *Runner) startTinyproxy(ctx context.Context, bin string) (*peerProc, error) {
	dir := filepath.Join(r.o.Dir, "tinyproxy")
	if err := ownedDir(dir, "nobody"); err != nil {
		return nil, fmt.Errorf("tinyproxy directory: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	hp, err := splitHostPort(ports[0])
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "tinyproxy.conf")
	group := "nogroup"
	if _, err := user.LookupGroup(group); err != nil {
		group = "nobody"
	}
	if err := writeTemplate(conf, tinyproxyConfig, map[string]any{
		"User": "nobody", "Group": group, "Host": hp.Host, "Port": hp.Port, "Dir": dir, "Upstream": r.sims.Upstreams[0].Addr,
	}); err != nil {
		return nil, err
	}
	p, err := r.ps.Start("tinyproxy", []string{bin, "-d", "-c", conf}, StartOptions{})
	if err != nil {
		return nil, err
	}
	pp := &peerProc{proc: p, addr: ports[0]}
	return pp, r.waitProxy(ctx, pp)
}

func writeTemplate(path string, t *template.Template, data any) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	err = t.Execute(f, data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Chmod(path, 0o644)
}

// waitProxy polls until a GET through the proxy reaches the target.
func (r *Runner) waitProxy(ctx context.Context, pp *peerProc) error {
	pu := &url.URL{Scheme: "http", Host: pp.addr}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if pp.proc.Exited() {
			return fmt.Errorf("%s exited while starting (see %s.log)", pp.proc.Name, pp.proc.Name)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.targetURL(16), nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s never forwarded a request: %w", pp.proc.Name, last)
}
