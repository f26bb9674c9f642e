package loadgen

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// runTunnels opens cfg.Tunnels tunnels (cfg.Concurrency setups in
// flight), then holds them for cfg.Duration, each sending a request every
// TunnelInterval (back to back when zero), then closes them. Setup latency
// and rate come from the first phase; latency, throughput and bytes/s from
// the second. A tunnel that fails is counted and not reopened, so
// TunnelsHeld says how many survived the hold.
func runTunnels(st stops, cfg *Config, t *tally, res *Result) error {
	ctx, hard := st.soft, st.hard
	target, err := url.Parse(cfg.URL)
	if err != nil {
		return fmt.Errorf("parsing url: %w", err)
	}
	tn, err := newTunneler(cfg, target)
	if err != nil {
		return err
	}
	tunnels := make([]*tunnel, cfg.Tunnels)
	setup := NewRecorder(cfg.Timeout)
	setupStart := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range min(cfg.Concurrency, cfg.Tunnels) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(cfg.Tunnels) {
					return
				}
				octx, cancel := context.WithTimeout(hard, cfg.Timeout)
				tun, d, err := tn.open(octx)
				cancel()
				if err != nil {
					c := ClassifyError(err)
					if hard.Err() != nil {
						c = ClassCut
					}
					t.add(c, 0)
					continue
				}
				setup.Record(w, d)
				tunnels[i] = tun
			}
		}()
	}
	wg.Wait()
	setupElapsed := time.Since(setupStart)
	opened := 0
	for _, tun := range tunnels {
		if tun != nil {
			opened++
		}
	}
	res.Tunnels, res.TunnelEvery, res.TunnelsOpened = cfg.Tunnels, cfg.TunnelInterval.Seconds(), opened
	if s := setupElapsed.Seconds(); s > 0 {
		res.SetupRate = float64(opened) / s
	}
	sq := setup.Quantiles()
	res.Setup = &sq
	res.Corrected = cfg.TunnelInterval > 0

	// Hold: every tunnel keeps its own schedule, spread evenly over one
	// interval so K tunnels make K/interval requests per second, and
	// measures each request from its intended time.
	// The hard bound cuts every tunnel at once.
	cut := context.AfterFunc(hard, func() {
		for _, tun := range tunnels {
			if tun != nil {
				_ = tun.conn.Close()
			}
		}
	})
	defer cut()
	lat := NewRecorder(cfg.Duration + cfg.Timeout)
	holdStart := time.Now()
	holdEnd := holdStart.Add(cfg.Duration)
	var held atomic.Int64
	var bytesBefore = t.bytes.Load()
	okBefore := t.classes[ClassOK].Load()
	for i, tun := range tunnels {
		if tun == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer tun.conn.Close()
			var offset time.Duration
			if cfg.TunnelInterval > 0 {
				offset = time.Duration(int64(cfg.TunnelInterval) * int64(i) / int64(cfg.Tunnels))
			}
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
		hold:
			for n := int64(0); ; n++ {
				// Back to back (interval 0) every request is due at once;
				// either way nothing starts after the hold.
				due := holdStart.Add(offset + time.Duration(n)*cfg.TunnelInterval)
				if !due.Before(holdEnd) || !time.Now().Before(holdEnd) || ctx.Err() != nil {
					break
				}
				if wait := time.Until(due); wait > 0 {
					timer.Reset(wait)
					select {
					case <-ctx.Done():
						break hold
					case <-timer.C:
					}
				}
				sent := time.Now()
				o := tn.do(tun, sent.Add(cfg.Timeout))
				if o.class != ClassOK && hard.Err() != nil {
					o.class = ClassCut
				}
				t.add(o.class, o.bytes)
				if o.class != ClassOK {
					return // lost; not reopened
				}
				from := sent
				if cfg.TunnelInterval > 0 {
					from = due
				}
				lat.Record(i, time.Since(from))
				if o.closed {
					return
				}
			}
			held.Add(1)
		}()
	}
	wg.Wait()
	hold := time.Since(holdStart).Seconds()
	res.TunnelsHeld = int(held.Load())
	res.Latency = lat.Quantiles()
	if hold > 0 {
		res.Throughput = float64(t.classes[ClassOK].Load()-okBefore) / hold
		res.BytesPerS = float64(t.bytes.Load()-bytesBefore) / hold
	}
	if ctx.Err() == nil {
		res.Stopped = "duration"
	}
	return nil
}
