package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/testenv"
)

// demo holds the simulations that a config's `demo` section starts: a
// vendor API handing out N simulated upstream proxies, and a target that
// reports what reached it. They exist so `make run` works on a machine with
// nothing else; a packaged config never has a demo section.
type demo struct {
	vendor    *testenv.Vendor
	upstreams []*testenv.UpstreamProxy
	target    *testenv.Target
}

func startDemo(d *config.Demo, log *slog.Logger) (*demo, error) {
	ups, err := testenv.StartUpstreams(d.UpstreamProxies, "demo", "demo-secret")
	if err != nil {
		return nil, fmt.Errorf("demo: starting upstream proxies: %w", err)
	}
	out := &demo{upstreams: ups}
	vp := make([]testenv.VendorProxy, 0, len(ups))
	for _, u := range ups {
		vp = append(vp, testenv.VendorProxy{Host: u.Host(), Port: u.Port(), Username: "demo", Password: "demo-secret", Region: "demo", Carrier: "loopback"})
	}
	if out.vendor, err = testenv.NewVendor(testenv.VendorConfig{Addr: d.VendorAddr, Proxies: vp}); err != nil {
		out.close()
		return nil, fmt.Errorf("demo: starting vendor: %w", err)
	}
	if out.target, err = testenv.NewTarget(d.TargetAddr); err != nil {
		out.close()
		return nil, fmt.Errorf("demo: starting target: %w", err)
	}
	out.target.Learn(ups)
	log.Warn("DEMO MODE: simulated vendor, upstream proxies and target are running in this process",
		"vendor", out.vendor.URL(), "target", out.target.URL(), "upstreamProxies", len(ups))
	return out, nil
}

func (d *demo) close() {
	var errs []error
	if d.target != nil {
		errs = append(errs, d.target.Close())
	}
	if d.vendor != nil {
		errs = append(errs, d.vendor.Close())
	}
	for _, u := range d.upstreams {
		errs = append(errs, u.Close())
	}
	_ = errors.Join(errs...)
}

// printTryThis shows the commands of the README's quick start with the
// addresses actually in use.
func (d *demo) printTryThis(w io.Writer, c *config.Config) {
	fmt.Fprintf(w, `
Proxy Pool demo is up. Loopback destinations are allowed only because
etc/proxypool/demo.yaml opts in (security.allowLoopbackDestinations: true).
Try, from another terminal:

  curl -x http://%[1]s %[2]s/hello
  curl -p -x http://%[1]s %[2]s/tunnelled
  curl -s -X POST http://%[3]s/v1/extract -H 'Content-Type: application/json' -d '{"count": 2, "fulfillment": "partial"}'
  curl -s http://%[4]s/v1/admin/status
  curl -s http://%[4]s/v1/admin/upstreams
  curl -s http://%[4]s/metrics | grep '^proxypool_'

Ctrl-C stops it.
`, c.Listeners.Gateway, d.target.URL(), c.Listeners.Distribution, c.Listeners.Admin)
}
