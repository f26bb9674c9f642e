// Package ctltest holds test helpers shared by the controller's packages:
// a provider adapter for testenv's simulated vendor, a provider set, a
// small in-memory gateway worker and a log sink safe for concurrent
// writes. It is imported by tests only and must never be imported by
// production code.
package ctltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// VendorAdapter speaks testenv's vendor API: GET {url}?count=N&format=F with
// the API key in X-Api-Key.
type VendorAdapter struct {
	// FixedCount, when set, is asked for whatever the host wants (a vendor
	// that ignores the requested count).
	FixedCount int
}

// BuildRequest implements upstream.Adapter.
func (a *VendorAdapter) BuildRequest(_ context.Context, in upstream.BuildInput) (upstream.Request, error) {
	base := in.Params["url"]
	if base == "" {
		return upstream.Request{}, errors.New("param url is required")
	}
	format := in.Params["format"]
	if format == "" {
		format = "json"
	}
	n := in.Count
	if a.FixedCount > 0 {
		n = a.FixedCount
	}
	req := upstream.Request{Method: "GET", URL: base + "?count=" + strconv.Itoa(n) + "&format=" + format, Headers: map[string]string{}}
	if k := in.Secrets["apiKey"]; k != "" {
		req.Headers["X-Api-Key"] = k
	}
	return req, nil
}

type vendorBody struct {
	Code int `json:"code"`
	Data *struct {
		List []struct {
			IP       string `json:"ip"`
			Port     int    `json:"port"`
			Username string `json:"username"`
			Password string `json:"password"`
			TTL      int64  `json:"ttl"`
			Region   string `json:"region"`
			Carrier  string `json:"carrier"`
		} `json:"list"`
	} `json:"data"`
}

// ParseResponse implements upstream.Adapter.
func (a *VendorAdapter) ParseResponse(_ context.Context, resp upstream.Response, _ time.Time) (upstream.ParseResult, error) {
	if strings.HasPrefix(resp.Headers["Content-Type"], "text/plain") {
		return parseText(resp.Body)
	}
	var b vendorBody
	if err := json.Unmarshal(resp.Body, &b); err != nil {
		return upstream.ParseResult{}, fmt.Errorf("decoding vendor JSON: %w", err)
	}
	if b.Code != 0 || b.Data == nil {
		return upstream.ParseResult{}, fmt.Errorf("vendor code %d", b.Code)
	}
	var out upstream.ParseResult
	for _, it := range b.Data.List {
		out.Proxies = append(out.Proxies, proxy.Candidate{
			Scheme: proxy.SchemeHTTP, Host: it.IP, Port: uint16(it.Port),
			Username: it.Username, Password: it.Password, TTL: time.Duration(it.TTL) * time.Second,
			Region: it.Region, Carrier: it.Carrier,
		})
	}
	return out, nil
}

func parseText(body []byte) (upstream.ParseResult, error) {
	var out upstream.ParseResult
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		if line == "" {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) != 2 && len(parts) != 4 {
			return upstream.ParseResult{}, fmt.Errorf("bad line %q", line)
		}
		port, err := strconv.Atoi(parts[1])
		if err != nil || port < 1 || port > 65535 {
			return upstream.ParseResult{}, fmt.Errorf("bad port in %q", line)
		}
		c := proxy.Candidate{Scheme: proxy.SchemeHTTP, Host: parts[0], Port: uint16(port)}
		if len(parts) == 4 {
			c.Username, c.Password = parts[2], parts[3]
		}
		out.Proxies = append(out.Proxies, c)
	}
	return out, nil
}

// Providers resolves adapters by plugin name.
type Providers map[string]upstream.Adapter

// Adapter implements upstream.Provider.
func (p Providers) Adapter(name string) (upstream.Adapter, error) {
	if a, ok := p[name]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("plugin %q not loaded", name)
}

// Worker is an in-memory gateway worker: it keeps the snapshots it was
// given and runtime counts a test sets.
type Worker struct {
	mu       sync.Mutex
	last     *worker.Snapshot
	versions []uint64
	counts   map[proxy.ID]worker.Runtime
	// OnApply, when set, runs inside Apply (a gateway reacting to a
	// snapshot, e.g. releasing capacity).
	OnApply func(s *worker.Snapshot)
	applied chan struct{}
}

// NewWorker returns an empty worker.
func NewWorker() *Worker {
	return &Worker{counts: map[proxy.ID]worker.Runtime{}, applied: make(chan struct{}, 1)}
}

// Apply implements worker.Applier.
func (w *Worker) Apply(_ context.Context, s *worker.Snapshot) error {
	w.mu.Lock()
	if w.last != nil && s.Version <= w.last.Version {
		w.mu.Unlock()
		return fmt.Errorf("snapshot version %d not newer than %d", s.Version, w.last.Version)
	}
	w.last = s
	w.versions = append(w.versions, s.Version)
	hook := w.OnApply
	w.mu.Unlock()
	if hook != nil {
		hook(s)
	}
	select {
	case w.applied <- struct{}{}:
	default:
	}
	return nil
}

// Runtime implements worker.RuntimeReader.
func (w *Worker) Runtime() []worker.Runtime {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]worker.Runtime, 0, len(w.counts))
	for _, r := range w.counts {
		out = append(out, r)
	}
	return out
}

// SetCounts sets a proxy's active and reserved counts (0,0 clears).
func (w *Worker) SetCounts(id proxy.ID, active, reserved int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if active == 0 && reserved == 0 {
		delete(w.counts, id)
		return
	}
	w.counts[id] = worker.Runtime{ID: id, Active: active, Reserved: reserved}
}

// Last returns the last applied snapshot.
func (w *Worker) Last() *worker.Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// Has reports whether the last snapshot carries id.
func (w *Worker) Has(id proxy.ID) bool {
	s := w.Last()
	if s == nil {
		return false
	}
	for i := range s.Proxies {
		if s.Proxies[i].ID == id {
			return true
		}
	}
	return false
}

// Applied is signalled (coalesced) after each Apply.
func (w *Worker) Applied() <-chan struct{} { return w.applied }

// Eventually polls cond every few milliseconds until it holds or the
// deadline passes; it returns whether it held.
func Eventually(deadline time.Duration, cond func() bool) bool {
	t := time.NewTimer(deadline)
	defer t.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-t.C:
			return cond()
		case <-tick.C:
		}
	}
}

var (
	_ upstream.Adapter     = (*VendorAdapter)(nil)
	_ upstream.Provider    = Providers(nil)
	_ worker.Applier       = (*Worker)(nil)
	_ worker.RuntimeReader = (*Worker)(nil)
)

// AddAvailable admits n proxies of upstream up (ports from firstPort on
// 127.0.0.1) and checks them into AVAILABLE at now, usable for usable and
// hard-expiring a minute later.
func AddAvailable(ctx context.Context, p activitypool.Pool, up string, n, firstPort int, now time.Time, usable time.Duration) ([]proxy.ID, error) {
	ps := make([]proxy.Proxy, n)
	for i := range ps {
		key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: uint16(firstPort + i), Username: "u"}
		ps[i] = proxy.Proxy{
			ID: proxy.MakeID(key), Key: key, Password: "pw", Upstream: up, CreatedAt: now,
			UsableUntil: now.Add(usable), ExpiresAt: now.Add(usable + time.Minute), MaxConcurrency: 4,
			State: proxy.StateFetched, Region: "eu",
		}
	}
	res, err := p.Admit(ctx, up, ps, 0)
	if err != nil {
		return nil, fmt.Errorf("admitting: %w", err)
	}
	for _, id := range res.Added {
		if err := p.Transition(ctx, id, proxy.StateFetched, proxy.StateChecking, now); err != nil {
			return nil, err
		}
		if err := p.RecordHealth(ctx, activitypool.Health{ID: id, From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: now, Success: true}); err != nil {
			return nil, err
		}
	}
	return res.Added, nil
}

// LogBuffer is a log sink safe for concurrent writes, for tests that read
// what a component's goroutines logged.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
