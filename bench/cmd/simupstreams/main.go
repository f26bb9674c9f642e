// Command simupstreams runs testenv's simulations in a process of their
// own, so a benchmark's load generator, system under test and simulations
// never share a Go runtime (or a descriptor limit): N upstream proxies, a
// target (plain and TLS) and a vendor API, each optional. It prints one
// JSON line describing what it started, then serves until SIGTERM or
// SIGINT. With -control it also serves a loopback control API that
// switches the vendor's mode and replaces the proxies it hands out.
//
// Everything listens on loopback only (testenv refuses anything else).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/proxypool/proxypool/testenv"
)

// maxSynthetic bounds the proxies one synthetic vendor list may hold.
const maxSynthetic = 1_000_000

// State is the JSON line printed at start and served at GET /state.
type State struct {
	PID       int        `json:"pid"`
	Upstreams []Upstream `json:"upstreams,omitempty"`
	Target    string     `json:"target,omitempty"`
	TLSTarget string     `json:"tls_target,omitempty"`
	Vendor    string     `json:"vendor,omitempty"`
	Control   string     `json:"control,omitempty"`
}

// Upstream is one simulated upstream proxy.
type Upstream struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "simupstreams: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("simupstreams", flag.ContinueOnError)
	var (
		n         = fs.Int("upstreams", 0, "upstream proxies to start (0..200)")
		idBase    = fs.Int("id-base", 0, "number the proxies up-(base+1)..; also picks their dial source 127.0.0.(20+id)")
		user      = fs.String("user", "", "username the upstreams require (empty with -pass empty: no auth)")
		pass      = fs.String("pass", "", "password the upstreams require")
		target    = fs.String("target", "", "start a plain HTTP target on this loopback address")
		tlsTarget = fs.String("tls-target", "", "start an HTTPS target on this loopback address")
		vendor    = fs.String("vendor", "", "start a vendor API on this loopback address")
		control   = fs.String("control", "", "serve the control API on this loopback address")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 0 || *n > 200 || *idBase < 0 || *idBase+*n > 200 {
		return fmt.Errorf("-upstreams %d with -id-base %d: ids must stay within 1..200", *n, *idBase)
	}
	st := State{PID: os.Getpid()}
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	ups := make([]*testenv.UpstreamProxy, 0, *n)
	for i := *idBase + 1; i <= *idBase+*n; i++ {
		cfg := testenv.UpstreamConfig{ID: "up-" + strconv.Itoa(i), Username: *user, Password: *pass}
		if src := fmt.Sprintf("127.0.0.%d", 20+i); canBind(src) {
			cfg.DialSource = src
		}
		up, err := testenv.NewUpstreamProxy(cfg)
		if err != nil {
			return err
		}
		closers = append(closers, up)
		ups = append(ups, up)
		st.Upstreams = append(st.Upstreams, Upstream{ID: up.ID(), Addr: up.Addr()})
	}
	if *target != "" {
		t, err := testenv.NewTarget(*target)
		if err != nil {
			return err
		}
		t.Learn(ups)
		closers = append(closers, t)
		st.Target = t.Addr()
	}
	if *tlsTarget != "" {
		t, err := testenv.NewTLSTarget(*tlsTarget)
		if err != nil {
			return err
		}
		closers = append(closers, t)
		st.TLSTarget = t.Addr()
	}
	var v *testenv.Vendor
	if *vendor != "" {
		var err error
		if v, err = testenv.NewVendor(testenv.VendorConfig{Addr: *vendor, TTL: time.Hour}); err != nil {
			return err
		}
		closers = append(closers, v)
		st.Vendor = v.URL()
	}
	if *control != "" {
		ln, err := net.Listen("tcp", *control)
		if err != nil {
			return fmt.Errorf("control listener: %w", err)
		}
		if !ln.Addr().(*net.TCPAddr).IP.IsLoopback() {
			ln.Close()
			return fmt.Errorf("control listener %s is not loopback", *control)
		}
		st.Control = ln.Addr().String()
		srv := &http.Server{Handler: &controller{vendor: v, state: &st}, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		closers = append(closers, srv)
	}
	if err := json.NewEncoder(stdout).Encode(st); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

func canBind(ip string) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// controller serves the control API:
//
//	GET  /state
//	POST /vendor/mode?m=normal|error500|empty|...
//	POST /vendor/proxies   JSON {"addrs":["h:p",...],"count":N,"userPrefix":"u","password":"p"}
//
// /vendor/proxies replaces the vendor's list with count proxies spread
// round-robin over addrs, proxy i with username userPrefix+i: distinct
// usernames are distinct unique keys, so a few real listeners stand for
// any number of proxies.
type controller struct {
	vendor *testenv.Vendor
	state  *State
}

func (c *controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/state":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c.state)
	case r.Method == http.MethodPost && r.URL.Path == "/vendor/mode" && c.vendor != nil:
		m, err := parseMode(r.URL.Query().Get("m"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.vendor.SetMode(m)
		fmt.Fprintln(w, m)
	case r.Method == http.MethodPost && r.URL.Path == "/vendor/proxies" && c.vendor != nil:
		var req struct {
			Addrs      []string `json:"addrs"`
			Count      int      `json:"count"`
			UserPrefix string   `json:"userPrefix"`
			Password   string   `json:"password"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			http.Error(w, "decoding: "+err.Error(), http.StatusBadRequest)
			return
		}
		list, err := synthetic(req.Addrs, req.Count, req.UserPrefix, req.Password)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.vendor.SetProxies(list)
		fmt.Fprintln(w, len(list))
	default:
		http.NotFound(w, r)
	}
}

func parseMode(s string) (testenv.VendorMode, error) {
	for m := testenv.VendorNormal; m <= testenv.VendorAuthRequired; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown vendor mode %q", s)
}

func synthetic(addrs []string, count int, userPrefix, password string) ([]testenv.VendorProxy, error) {
	if len(addrs) == 0 || count < 1 || count > maxSynthetic {
		return nil, fmt.Errorf("want 1..%d proxies over at least one address", maxSynthetic)
	}
	type hp struct {
		host string
		port int
	}
	parsed := make([]hp, 0, len(addrs))
	for _, a := range addrs {
		h, p, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", a, err)
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", a, err)
		}
		if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
			return nil, errors.New("address " + a + " is not a loopback IP")
		}
		parsed = append(parsed, hp{h, port})
	}
	out := make([]testenv.VendorProxy, count)
	for i := range out {
		a := parsed[i%len(parsed)]
		user := ""
		if userPrefix != "" {
			user = userPrefix + strconv.Itoa(i)
		}
		out[i] = testenv.VendorProxy{Host: a.host, Port: a.port, Username: user, Password: password,
			Region: "bench", Carrier: "loopback"}
	}
	return out, nil
}

var _ http.Handler = (*controller)(nil)
