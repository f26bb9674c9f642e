package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	httpapi "github.com/proxypool/proxypool/engine/adapters/http"
	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/gateway"
	"github.com/proxypool/proxypool/engine/lifecycle"
	"github.com/proxypool/proxypool/engine/version"
)

// readyPoll is how often startup checks whether the first usable snapshot
// has been published, to tell systemd READY=1.
const readyPoll = 100 * time.Millisecond

// appliance is the standalone process: controller, checker and gateway on
// embedded storage, plus the REST surfaces.
type appliance struct {
	path   string
	log    *slog.Logger
	notify *lifecycle.Notifier

	mu      sync.Mutex // serialises reloads (signal and admin API)
	cfg     *config.Config
	plugins *plugin.Set

	stores *stores
	ctrl   *controller.Controller
	gw     *gateway.Gateway
	dist   *httpapi.DistributionHandler
	admin  *httpapi.AdminHandler
}

func run(path string, stderr io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	log, err := lifecycle.NewLogger(stderr, cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		return err
	}
	sig := lifecycle.WatchSignals()
	defer sig.Close()
	a := &appliance{path: path, log: log, notify: lifecycle.NewNotifier(log), cfg: cfg}

	res, err := loadPlugins(cfg)
	if err != nil {
		return err
	}
	for name, e := range res.Errors {
		log.Error("plugin does not load", "plugin", name, "err", e)
	}
	if err := validatePlugins(cfg, res.Set); err != nil {
		return err
	}
	a.plugins = res.Set

	var dm *demo
	if cfg.Demo != nil {
		if dm, err = startDemo(cfg.Demo, log); err != nil {
			return err
		}
		defer dm.close()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	st, err := openStores(cfg, log)
	if err != nil {
		return err
	}
	defer st.close()
	a.stores = st
	a.recordRevision(cfg)

	if a.gw, err = gateway.New(gateway.Options{Config: cfg, Logger: log, Registry: reg}); err != nil {
		return err
	}
	defer a.gw.Close()
	instance := instanceID()
	if a.ctrl, err = controller.New(controller.Options{
		Config: cfg, Pool: st.pool, Management: st.mgmt, Providers: a.plugins, Worker: a.gw,
		Logger: log, Registry: reg, Version: version.Version,
		Coordinator: st.coordinator(), Holder: instance,
	}); err != nil {
		return err
	}
	if a.dist, err = httpapi.NewDistribution(httpapi.DistributionOptions{
		Extractor: a.ctrl, Surface: cfg.Distribution, Extraction: cfg.Extraction,
		Registry: reg, Logger: log.With("component", "distribution"),
	}); err != nil {
		return err
	}
	if a.admin, err = httpapi.NewAdmin(httpapi.AdminOptions{
		Admin: a.ctrl, Reloader: a, Surface: cfg.Admin, Registry: reg, Logger: log.With("component", "admin"),
	}); err != nil {
		return err
	}
	ops, err := httpapi.NewOps(httpapi.OpsOptions{Readiness: a.ctrl, Gatherer: reg, Registry: reg, Logger: log})
	if err != nil {
		return err
	}
	adminMux := http.NewServeMux()
	adminMux.Handle("/v1/admin/", a.admin)
	adminMux.Handle("/", ops)

	// Bind every listener before starting anything, so a port conflict
	// fails the start cleanly.
	type served struct {
		name string
		ln   net.Listener
		srv  *http.Server
	}
	var servers []served
	var gwLn net.Listener
	closeAll := func() {
		for _, s := range servers {
			s.ln.Close()
		}
		if gwLn != nil {
			gwLn.Close()
		}
	}
	activated, err := activatedListeners()
	if err != nil {
		return err
	}
	for name, ln := range activated {
		switch name {
		case "gateway", "distribution", "admin", "metrics":
			if err := strictActivated(cfg, name, ln.Addr()); err != nil {
				return err
			}
		default:
			log.Warn("ignoring a socket-activated listener with an unknown name", "name", name, "addr", ln.Addr().String())
		}
	}
	listen := func(name, addr string, h http.Handler) error {
		ln, err := bind(name, addr, activated)
		if err != nil {
			closeAll()
			return err
		}
		if ln != nil {
			servers = append(servers, served{name, ln, httpapi.NewServer(h, httpapi.ServerLimits{})})
		}
		return nil
	}
	if err := listen("distribution", cfg.Listeners.Distribution, a.dist); err != nil {
		return err
	}
	if err := listen("admin", cfg.Listeners.Admin, adminMux); err != nil {
		return err
	}
	if err := listen("metrics", cfg.Listeners.Metrics, ops); err != nil {
		return err
	}
	if gwLn, err = bind("gateway", cfg.Listeners.Gateway, activated); err != nil {
		closeAll()
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = a.ctrl.Run(ctx)
	}()
	serveErr := make(chan error, len(servers)+1)
	if gwLn != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.gw.Serve(ctx, gwLn); err != nil {
				serveErr <- fmt.Errorf("gateway: %w", err)
			}
		}()
	}
	for _, s := range servers {
		go func() {
			if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("%s: %w", s.name, err)
			}
		}()
		log.Info("listening", "surface", s.name, "addr", s.ln.Addr().String())
	}
	if gwLn != nil {
		log.Info("listening", "surface", "gateway", "addr", gwLn.Addr().String())
	}
	go a.notifyReadyWhenUsable(ctx, dm)
	go sweep(ctx, st)
	if st.coord != nil && gwLn != nil {
		go heartbeat(ctx, st.coord, instance, cfg.Storage.Redis.HeartbeatInterval, a.snapshotVersion, log.With("component", "heartbeat"))
	}
	go a.notify.Watchdog(ctx)

	var runErr error
loop:
	for {
		select {
		case <-sig.Reload:
			if err := a.Reload(ctx, "signal:SIGHUP"); err != nil {
				log.Error("reload failed; keeping the running configuration", "err", err)
			}
		case s := <-sig.Stop:
			log.Info("stopping", "signal", s.String())
			break loop
		case runErr = <-serveErr:
			log.Error("listener failed", "err", runErr)
			break loop
		}
	}

	a.notify.Stopping()
	a.mu.Lock()
	drain := a.cfg.Shutdown
	a.mu.Unlock()
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), drain)
	defer cancelShutdown()
	for _, s := range servers {
		if err := s.srv.Shutdown(shutdownCtx); err != nil {
			log.Warn("shutdown", "surface", s.name, "err", err)
		}
	}
	cancel() // the gateway drains in-flight requests within its own deadline
	wg.Wait()
	log.Info("stopped")
	return runErr
}

// activatedListeners returns the sockets systemd passed (socket
// activation), by FileDescriptorName; empty when not socket-activated.
func activatedListeners() (map[string]net.Listener, error) {
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	out := make(map[string]net.Listener, len(named))
	for name, lns := range named {
		if len(lns) != 1 || lns[0] == nil {
			return nil, fmt.Errorf("socket activation: want one stream socket named %q, got %d", name, len(lns))
		}
		out[name] = lns[0]
	}
	return out, nil
}

// strictActivated applies strict mode to a socket systemd bound: the
// configured address was checked by validation, the activated one was not.
func strictActivated(cfg *config.Config, name string, addr net.Addr) error {
	if !cfg.StrictMode() || config.IsLoopbackListener(addr.String()) {
		return nil
	}
	var a *config.Auth
	var acc *config.Access
	switch name {
	case "gateway":
		a, acc = &cfg.Gateway.Auth, &cfg.Gateway.Access
	case "distribution":
		a, acc = &cfg.Distribution.Auth, &cfg.Distribution.Access
	case "admin":
		a, acc = &cfg.Admin.Auth, &cfg.Admin.Access
	default:
		return nil // metrics carry no credentials and no proxying
	}
	if a.Mode == "none" && len(acc.AllowCIDRs) == 0 {
		return fmt.Errorf("strict mode: socket-activated %s listener %s is beyond loopback with auth none and no access.allowCIDRs", name, addr)
	}
	return nil
}

// bind returns the activated socket named name, else listens on addr
// (nil, nil when addr is empty: that surface is off).
func bind(name, addr string, activated map[string]net.Listener) (net.Listener, error) {
	if ln, ok := activated[name]; ok {
		return ln, nil
	}
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w", name, err)
	}
	return ln, nil
}

// snapshotVersion is the version of the snapshot the gateway applied (0
// before the first).
func (a *appliance) snapshotVersion() uint64 {
	if s := a.gw.Snapshot(); s != nil {
		return s.Version
	}
	return 0
}

// notifyReadyWhenUsable sends READY=1 once the controller has published a
// snapshot with a usable proxy (or has no upstream to wait for).
func (a *appliance) notifyReadyWhenUsable(ctx context.Context, dm *demo) {
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	a.notify.Status("waiting for the first usable proxy")
	for !a.ctrl.Ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	a.notify.Ready()
	a.notify.Status("serving")
	a.log.Info("ready")
	if dm != nil {
		a.mu.Lock()
		cfg := a.cfg
		a.mu.Unlock()
		dm.printTryThis(os.Stdout, cfg)
	}
}

// Reload re-reads the config file and the plugins directory and swaps them
// in; any failure keeps the running configuration. It implements the admin
// API's Reloader, and serves SIGHUP.
func (a *appliance) Reload(ctx context.Context, actor string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notify.Reloading()
	defer a.notify.Ready()
	err := a.reload(ctx)
	a.ctrl.RecordReload(actor, err)
	if err == nil {
		a.log.Info("reloaded", "actor", actor, "source", a.path)
	}
	return err
}

func (a *appliance) reload(ctx context.Context) error {
	cfg, err := config.Load(a.path)
	if err != nil {
		return err
	}
	if err := immutableOnReload(a.cfg, cfg); err != nil {
		return err
	}
	res, err := loadPlugins(cfg)
	if err != nil {
		return err
	}
	for name, e := range res.Errors {
		a.log.Error("plugin does not load; keeping its previous version", "plugin", name, "err", e)
	}
	set := plugin.Merge(a.plugins, res)
	if err := validatePlugins(cfg, set); err != nil {
		return err
	}
	// Everything that can fail on its own input is tried before anything
	// is swapped: the REST surfaces validate auth and CIDRs, the gateway
	// its limits.
	if err := a.ctrl.Reload(ctx, cfg, set); err != nil {
		return err
	}
	if err := a.gw.UpdateConfig(cfg); err != nil {
		return err
	}
	if err := a.dist.Reconfigure(cfg.Distribution, cfg.Extraction); err != nil {
		return err
	}
	if err := a.admin.Reconfigure(cfg.Admin); err != nil {
		return err
	}
	a.cfg, a.plugins = cfg, set
	a.recordRevision(cfg)
	return nil
}

// recordRevision notes an accepted configuration in the management store.
// A failure is logged: the configuration is already in force.
func (a *appliance) recordRevision(cfg *config.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rev := management.Revision{At: time.Now(), Fingerprint: a.stores.fingerprint(cfg), Source: cfg.Source}
	if err := a.stores.mgmt.RecordRevision(ctx, rev); err != nil {
		a.log.Warn("recording config revision", "err", err)
	}
}

// sweepEvery paces the activity pool's housekeeping (stores.sweep).
const sweepEvery = 10 * time.Second

func sweep(ctx context.Context, st *stores) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			st.sweep(ctx, now)
		}
	}
}

// immutableOnReload refuses changes that need a restart: the listeners are
// bound once, and the stores are opened once.
func immutableOnReload(old, next *config.Config) error {
	var errs config.Errors
	if old.Listeners != next.Listeners {
		errs = append(errs, config.FieldError{Path: "listeners", Msg: "cannot change on reload; restart the service"})
	}
	if old.Storage != next.Storage {
		errs = append(errs, config.FieldError{Path: "storage", Msg: "cannot change on reload; restart the service"})
	}
	if old.StateDir != next.StateDir {
		errs = append(errs, config.FieldError{Path: "stateDir", Msg: "cannot change on reload; restart the service"})
	}
	if (old.Demo == nil) != (next.Demo == nil) || (old.Demo != nil && *old.Demo != *next.Demo) {
		errs = append(errs, config.FieldError{Path: "demo", Msg: "cannot change on reload; restart the service"})
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

var _ httpapi.Reloader = (*appliance)(nil)
