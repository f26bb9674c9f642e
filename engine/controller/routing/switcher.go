package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

// Store holds the cursors; management.Store implements it.
type Store interface {
	Cursor(ctx context.Context, routing string) (routing.Cursor, error)
	CompareAndSetCursor(ctx context.Context, routing string, old, next routing.Cursor) (bool, error)
}

// Typed errors.
var (
	ErrUnknownRouting = errors.New("unknown routing")
	// ErrInvalidSwitch: not a sequential routing, or index out of range.
	ErrInvalidSwitch = errors.New("invalid routing switch")
)

// maxCASAttempts bounds retries against concurrent writers; each retry
// happens only if the routing still points at the same upstream.
const maxCASAttempts = 16

// Compile turns configured routings into domain rules, in order.
func Compile(rs []config.Routing) []routing.Rule {
	out := make([]routing.Rule, 0, len(rs))
	for _, r := range rs {
		rule := routing.Rule{
			Name:          r.Name,
			Clients:       append([]string(nil), r.Match.Clients...),
			Upstreams:     append([]string(nil), r.Upstreams...),
			Strategy:      routing.LeastConnections,
			OnExhausted:   routing.Stop,
			OnUnavailable: routing.Reject,
			StickyHeader:  r.Sticky.Header,
			MaxAttempts:   r.Retry.MaxAttempts,
		}
		for _, h := range r.Match.Hosts {
			rule.Hosts = append(rule.Hosts, normHost(h))
		}
		for _, p := range r.Match.Ports {
			rule.Ports = append(rule.Ports, uint16(p))
		}
		if len(r.Tags) > 0 {
			rule.Tags = make(map[string]string, len(r.Tags))
			for k, v := range r.Tags {
				rule.Tags[k] = v
			}
		}
		if r.Strategy == "sequential" {
			rule.Strategy = routing.Sequential
		}
		switch r.OnExhausted {
		case "loop":
			rule.OnExhausted = routing.Loop
		case "stayLast":
			rule.OnExhausted = routing.StayLast
		}
		switch r.OnUnavailable {
		case "wait":
			rule.OnUnavailable = routing.Wait
		case "direct":
			rule.OnUnavailable = routing.Direct
		}
		out = append(out, rule)
	}
	return out
}

func normHost(h string) string {
	b := []byte(h)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	s := string(b)
	for len(s) > 0 && s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

// Effective is the upstream index a cursor selects among n: -1 when
// exhausted; 0 when the stored index no longer fits (the routing's list
// was shortened by a reload, so it starts over).
func Effective(c routing.Cursor, n int) int {
	if c.Exhausted {
		return -1
	}
	if c.Index < 0 || c.Index >= n {
		return 0
	}
	return c.Index
}

// Options configures a Switcher.
type Options struct {
	Store Store
	// Enabled reports whether an upstream takes new allocations; disabled
	// ones are skipped when advancing. nil: all enabled.
	Enabled  func(upstream string) bool
	Logger   *slog.Logger
	Registry *prometheus.Registry
}

// Switcher advances sequential routings.
type Switcher struct {
	o        Options
	rules    atomic.Pointer[[]routing.Rule]
	switches *prometheus.CounterVec
}

// New returns a Switcher with no rules; SetRules installs them.
func New(o Options) *Switcher {
	if o.Enabled == nil {
		o.Enabled = func(string) bool { return true }
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Switcher{o: o, switches: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "proxypool", Subsystem: "routing", Name: "switches_total",
		Help: "Sequential routing cursor moves, by reason (depleted, disabled, manual, exhausted).",
	}, []string{"routing", "reason"})}
	if o.Registry != nil {
		o.Registry.MustRegister(s.switches)
	}
	empty := []routing.Rule{}
	s.rules.Store(&empty)
	return s
}

// SetRules installs a new generation of compiled rules.
func (s *Switcher) SetRules(rules []routing.Rule) { s.rules.Store(&rules) }

// Rules returns the current rules; callers must not modify them.
func (s *Switcher) Rules() []routing.Rule { return *s.rules.Load() }

func (s *Switcher) rule(name string) (routing.Rule, bool) {
	for _, r := range s.Rules() {
		if r.Name == name {
			return r, true
		}
	}
	return routing.Rule{}, false
}

// Depleted advances, exactly once, every sequential routing whose current
// upstream is upstream. It returns the routings it moved. A lost
// compare-and-set is retried only while the routing still points at the
// depleted upstream, so concurrent calls never skip past the next one.
func (s *Switcher) Depleted(ctx context.Context, upstream string) ([]string, error) {
	return s.advanceAll(ctx, upstream, "depleted")
}

// Disabled moves every sequential routing whose current upstream is the
// disabled upstream on to its next enabled one (seed 000 §9: disabled
// upstreams take no new allocations and are skipped; the cursor is
// persisted like any switch). When no enabled upstream follows under the
// routing's policy the cursor stays: the gateway sees the upstream
// disabled and applies onUnavailable, and re-enabling it restores the
// routing. Call it after the upstream is disabled, so Enabled already
// reports it.
func (s *Switcher) Disabled(ctx context.Context, upstream string) ([]string, error) {
	if s.o.Enabled(upstream) {
		return nil, nil
	}
	return s.advanceAll(ctx, upstream, "disabled")
}

func (s *Switcher) advanceAll(ctx context.Context, upstream, reason string) ([]string, error) {
	var (
		moved []string
		errs  []error
	)
	for _, r := range s.Rules() {
		if r.Strategy != routing.Sequential {
			continue
		}
		ok, err := s.advance(ctx, r, upstream, reason)
		if err != nil {
			errs = append(errs, fmt.Errorf("advancing routing %s: %w", r.Name, err))
		}
		if ok {
			moved = append(moved, r.Name)
		}
	}
	return moved, errors.Join(errs...)
}

func (s *Switcher) advance(ctx context.Context, r routing.Rule, upstream, reason string) (bool, error) {
	n := len(r.Upstreams)
	skip := func(i int) bool { return !s.o.Enabled(r.Upstreams[i]) }
	for range maxCASAttempts {
		cur, err := s.o.Store.Cursor(ctx, r.Name)
		if err != nil {
			return false, fmt.Errorf("reading cursor: %w", err)
		}
		idx := Effective(cur, n)
		if idx < 0 || r.Upstreams[idx] != upstream {
			return false, nil // already moved on (by us or another)
		}
		from := cur
		from.Index = idx
		next, ok := routing.Advance(from, n, r.OnExhausted, skip)
		if !ok || (next.Exhausted && reason == "disabled") {
			// Disabling never exhausts a routing: with no enabled upstream
			// after it, the cursor stays and re-enabling restores it.
			return false, nil
		}
		won, err := s.o.Store.CompareAndSetCursor(ctx, r.Name, cur, next)
		if err != nil {
			return false, fmt.Errorf("writing cursor: %w", err)
		}
		if won {
			why, to := reason, "exhausted"
			if next.Exhausted {
				why = "exhausted"
			} else {
				to = r.Upstreams[next.Index]
			}
			s.switches.WithLabelValues(r.Name, why).Inc()
			s.o.Logger.Info("sequential routing switched", "routing", r.Name, "from", upstream, "to", to, "reason", reason, "generation", next.Generation)
			return true, nil
		}
	}
	return false, fmt.Errorf("cursor kept changing after %d attempts", maxCASAttempts)
}

// Switch sets a sequential routing's cursor to index (admin).
func (s *Switcher) Switch(ctx context.Context, name string, index int) (routing.Cursor, error) {
	r, ok := s.rule(name)
	if !ok {
		return routing.Cursor{}, fmt.Errorf("switching routing %q: %w", name, ErrUnknownRouting)
	}
	if r.Strategy != routing.Sequential {
		return routing.Cursor{}, fmt.Errorf("switching routing %q: %w: not sequential", name, ErrInvalidSwitch)
	}
	if index < 0 || index >= len(r.Upstreams) {
		return routing.Cursor{}, fmt.Errorf("switching routing %q: %w: index %d not in [0,%d)", name, ErrInvalidSwitch, index, len(r.Upstreams))
	}
	for range maxCASAttempts {
		cur, err := s.o.Store.Cursor(ctx, name)
		if err != nil {
			return routing.Cursor{}, fmt.Errorf("switching routing %q: reading cursor: %w", name, err)
		}
		next := routing.Cursor{Index: index, Generation: cur.Generation + 1}
		won, err := s.o.Store.CompareAndSetCursor(ctx, name, cur, next)
		if err != nil {
			return routing.Cursor{}, fmt.Errorf("switching routing %q: writing cursor: %w", name, err)
		}
		if won {
			s.switches.WithLabelValues(name, "manual").Inc()
			return next, nil
		}
	}
	return routing.Cursor{}, fmt.Errorf("switching routing %q: cursor kept changing after %d attempts", name, maxCASAttempts)
}

// Cursor reads a routing's stored cursor.
func (s *Switcher) Cursor(ctx context.Context, name string) (routing.Cursor, error) {
	if _, ok := s.rule(name); !ok {
		return routing.Cursor{}, fmt.Errorf("reading routing %q: %w", name, ErrUnknownRouting)
	}
	c, err := s.o.Store.Cursor(ctx, name)
	if err != nil {
		return routing.Cursor{}, fmt.Errorf("reading routing %q cursor: %w", name, err)
	}
	return c, nil
}

var _ Store = management.Store(nil)
