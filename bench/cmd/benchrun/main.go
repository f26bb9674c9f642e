// Command benchrun runs a benchmark suite of bench/suite: quick (CI, under
// a minute), full (`make bench`), tunnels or snapshot (the full suite's
// 10,000 held tunnels, or its 100k snapshot growth, alone) or peers
// (`make bench-peers`). It prints one line per figure on stdout, progress
// on stderr, and writes the report to -dir/<suite>.json. Wiring only.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/proxypool/proxypool/bench/suite"
)

func main() {
	var o suite.Options
	flag.StringVar(&o.Suite, "suite", "quick", "quick | full | tunnels | snapshot | peers")
	flag.StringVar(&o.Dir, "dir", ".run/bench", "configs, logs, reports and profiles go here")
	flag.StringVar(&o.Proxypool, "proxypool", "bin/proxypool", "the appliance under test")
	flag.StringVar(&o.Loadgen, "loadgen", "bin/proxy-loadgen", "the load generator")
	flag.StringVar(&o.Sims, "sims", "bin/simupstreams", "the simulations")
	flag.StringVar(&o.PprofProxypool, "pprof-proxypool", "", "the appliance built with pprof (full suite: profile it)")
	only := flag.String("peers-only", "", "peers suite: comma-separated comparisons to run (http, connect, bulk); empty runs all")
	flag.Float64Var(&o.SnapshotRate, "snapshot-rate", 0, "snapshot suite: open-loop load in req/s (default 3500)")
	flag.Float64Var(&o.SnapshotCheckRate, "snapshot-check-rate", -1, "snapshot suite: checker.maxPerSecond during the growth (0: unbounded; negative: the suite's own)")
	flag.IntVar(&o.PeersRounds, "peers-rounds", 0, "peers suite: rounds instead of the default 5")
	flag.Parse()
	if *only != "" {
		o.PeersOnly = strings.Split(*only, ",")
	}
	o.Out, o.Log = os.Stdout, os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := suite.Run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "benchrun: %v\n", err)
		os.Exit(1)
	}
}
