// Command proxy-loadgen drives an HTTP proxy (or a target directly) with
// bounded load and reports latency quantiles, error classes, throughput,
// its own Go memory and GC, and the system under test's CPU, RSS and open
// descriptors (seed 000 §3.4). The engine is bench/loadgen; this file is
// flags and wiring only.
//
//	proxy-loadgen -x http://127.0.0.1:8080 -d 30s -rate 5000 http://127.0.0.1:9091/bytes/1024
//	proxy-loadgen -x http://127.0.0.1:8080 -mode connect -n 10000 http://127.0.0.1:9091/bytes/1024
//	proxy-loadgen -x http://127.0.0.1:8080 -mode tunnels -tunnels 1000 -tunnel-interval 1s -d 30s http://127.0.0.1:9091/bytes/1024
//	proxy-loadgen -mode extract -n 1000 -c 16 http://127.0.0.1:8081/v1/extract
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/proxypool/proxypool/bench/loadgen"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// headerFlag collects repeated -H "Name: value".
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fmt.Errorf("header %q: want \"Name: value\"", v)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

// pidsFlag collects repeated -sut-pid.
type pidsFlag []int

func (f *pidsFlag) String() string { return fmt.Sprint([]int(*f)) }

func (f *pidsFlag) Set(v string) error {
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return fmt.Errorf("pid %q: want a positive number", v)
	}
	*f = append(*f, pid)
	return nil
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxy-loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      loadgen.Config
		mode     = fs.String("mode", string(loadgen.ModeHTTP), "http | connect (new tunnel per request) | tunnels (hold -tunnels) | extract (POST /v1/extract)")
		headers  headerFlag
		pids     pidsFlag
		body     = fs.String("body", "", "request body")
		bodyFile = fs.String("body-file", "", "read the request body from this file")
		asJSON   = fs.Bool("json", false, "print the result as JSON instead of a table")
		progress = fs.Duration("progress", loadgen.DefaultProgressInterval, "progress line on stderr this often (0: none)")
	)
	fs.StringVar(&cfg.Scenario, "scenario", "", "name printed with the result (default: the mode)")
	fs.StringVar(&cfg.URL, "url", "", "target URL, http:// or https:// (or the first argument)")
	fs.StringVar(&cfg.Proxy, "x", "", "proxy http://[user:pass@]host:port (default: go direct)")
	fs.StringVar(&cfg.Method, "X", "", "method (default GET; POST in extract mode)")
	fs.Var(&headers, "H", "request header \"Name: value\" (repeatable)")
	fs.Int64Var(&cfg.Requests, "n", 0, "stop after this many requests (0: no count bound)")
	fs.DurationVar(&cfg.Duration, "d", 0, "issue requests for this long (0: no time bound)")
	fs.DurationVar(&cfg.MaxDuration, "max-duration", loadgen.DefaultMaxDuration, "hard stop, whatever else happens")
	fs.IntVar(&cfg.Concurrency, "c", loadgen.DefaultConcurrency, "concurrent clients, one keep-alive connection each")
	fs.Float64Var(&cfg.Rate, "rate", 0, "target requests/s as an open-loop schedule, latency measured from intended send time (0: as fast as possible)")
	fs.DurationVar(&cfg.Timeout, "timeout", loadgen.DefaultTimeout, "per request (and per tunnel setup)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "do not verify https:// targets' certificates")
	fs.BoolVar(&cfg.DisableKeepAlive, "no-keepalive", false, "new connection per request (http mode)")
	fs.IntVar(&cfg.Tunnels, "tunnels", 0, "tunnels mode: how many tunnels to hold")
	fs.DurationVar(&cfg.TunnelInterval, "tunnel-interval", 0, "tunnels mode: each tunnel sends a request this often (0: back to back)")
	fs.IntVar(&cfg.ExtractCount, "extract-count", loadgen.DefaultExtractCount, "extract mode: proxies per call")
	fs.Var(&pids, "sut-pid", "process of the system under test to sample from /proc (repeatable)")
	fs.BoolVar(&cfg.SUTTree, "sut-tree", false, "also sample the descendants of -sut-pid")
	fs.DurationVar(&cfg.SampleInterval, "sample-interval", loadgen.DefaultSampleInterval, "how often /proc is sampled")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.URL == "" && fs.NArg() > 0 {
		cfg.URL = fs.Arg(0)
	}
	if fs.NArg() > 1 || (cfg.URL != "" && fs.NArg() == 1 && fs.Arg(0) != cfg.URL) {
		fmt.Fprintln(stderr, "proxy-loadgen: one target URL, please")
		return 2
	}
	cfg.Mode = loadgen.Mode(*mode)
	cfg.Headers = headers.h
	cfg.SUTPIDs = pids
	switch {
	case *body != "" && *bodyFile != "":
		fmt.Fprintln(stderr, "proxy-loadgen: -body and -body-file are exclusive")
		return 2
	case *body != "":
		cfg.Body = []byte(*body)
	case *bodyFile != "":
		b, err := readBounded(*bodyFile, loadgen.MaxBodyBytes)
		if err != nil {
			fmt.Fprintf(stderr, "proxy-loadgen: %v\n", err)
			return 2
		}
		cfg.Body = b
	}
	if *progress > 0 {
		cfg.Progress, cfg.ProgressInterval = stderr, *progress
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "proxy-loadgen: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "proxy-loadgen: %v\n", err)
		return 1
	}
	if *asJSON {
		err = res.WriteJSON(stdout)
	} else {
		err = res.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "proxy-loadgen: %v\n", err)
		return 1
	}
	return 0
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading body: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading body: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("reading body: %s is larger than %d bytes", path, limit)
	}
	return b, nil
}

var (
	_ flag.Value = (*headerFlag)(nil)
	_ flag.Value = (*pidsFlag)(nil)
)
