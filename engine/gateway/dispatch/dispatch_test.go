package dispatch_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock is a settable clock; tests move it instead of sleeping.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock               { c := &fakeClock{}; c.ns.Store(t0.UnixNano()); return c }
func (c *fakeClock) Now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

type queue struct {
	mu  sync.Mutex
	got []worker.Outcome
}

func (q *queue) Enqueue(o worker.Outcome) { q.mu.Lock(); q.got = append(q.got, o); q.mu.Unlock() }

type env struct {
	clock *fakeClock
	reg   *snapshot.Registry
	snaps *snapshot.Holder
	d     *dispatch.Dispatcher
	prom  *prometheus.Registry
	out   *queue
}

func newEnv(t testing.TB, ws *worker.Snapshot, maxStale time.Duration) *env {
	t.Helper()
	e := &env{clock: newClock(), snaps: &snapshot.Holder{}, prom: prometheus.NewRegistry(), out: &queue{}}
	e.reg = snapshot.NewRegistry(0, e.clock.Now)
	if ws != nil {
		s, err := snapshot.Build(ws, e.reg)
		if err != nil {
			t.Fatal(err)
		}
		e.snaps.Store(s)
	}
	e.d = dispatch.New(e.snaps, dispatch.Options{Now: e.clock.Now, MaxStaleAge: maxStale, Outcomes: e.out, Registerer: e.prom})
	return e
}

func px(up string, i int, mut ...func(*proxy.Proxy)) proxy.Proxy {
	p := gwtest.MakeProxy(up, "192.0.2."+strconv.Itoa(i), 3128, "", "", t0)
	for _, m := range mut {
		m(&p)
	}
	return p
}

func TestRouting(t *testing.T) {
	rules := []routing.Rule{
		{Name: "api", Hosts: []string{"api.example.com"}, Upstreams: []string{"a"}, MaxAttempts: 2},
		{Name: "wild", Hosts: []string{"*.example.com"}, Ports: []uint16{443}, Upstreams: []string{"b"}, MaxAttempts: 2},
		{Name: "vip", Clients: []string{"alice"}, Upstreams: []string{"c"}, MaxAttempts: 2},
		{Name: "fallback", Hosts: []string{"*.org"}, Upstreams: []string{"a", "b"}, MaxAttempts: 2},
	}
	ws := &worker.Snapshot{Version: 1, ValidUntil: t0.Add(time.Hour), Routings: rules,
		Proxies: []proxy.Proxy{px("a", 1), px("b", 2), px("c", 3)}}
	e := newEnv(t, ws, 0)
	tests := []struct {
		name     string
		req      dispatch.Request
		rule     string
		upstream string
		err      error
	}{
		{"exact host", dispatch.Request{Host: "api.example.com", Port: 80}, "api", "a", nil},
		{"wildcard and port", dispatch.Request{Host: "www.example.com", Port: 443}, "wild", "b", nil},
		{"wildcard wrong port falls through", dispatch.Request{Host: "www.example.com", Port: 80, Client: "alice"}, "vip", "c", nil},
		{"wildcard excludes apex", dispatch.Request{Host: "example.com", Port: 443}, "", "", dispatch.ErrNoRoute},
		{"client", dispatch.Request{Host: "x.net", Port: 80, Client: "alice"}, "vip", "c", nil},
		{"no route", dispatch.Request{Host: "x.net", Port: 80, Client: "bob"}, "", "", dispatch.ErrNoRoute},
		{"multi-upstream rule", dispatch.Request{Host: "a.org", Port: 80}, "fallback", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := e.d.Acquire(context.Background(), &tc.req)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			defer e.d.Release(a, worker.Outcome{})
			if a.Rule.Name != tc.rule || (tc.upstream != "" && a.Target.Upstream != tc.upstream) {
				t.Fatalf("rule %s upstream %s, want %s %s", a.Rule.Name, a.Target.Upstream, tc.rule, tc.upstream)
			}
		})
	}
}

func TestCandidateFilter(t *testing.T) {
	rule := func(name string, mut func(*routing.Rule)) routing.Rule {
		r := routing.Rule{Name: name, Hosts: []string{name}, Upstreams: []string{name}, MaxAttempts: 2}
		if mut != nil {
			mut(&r)
		}
		return r
	}
	soon := func(p *proxy.Proxy) { p.UsableUntil = t0.Add(time.Minute) }
	tagged := func(p *proxy.Proxy) { p.Tags = map[string]string{"tier": "gold"} }
	ws := &worker.Snapshot{
		Version: 1, ValidUntil: t0.Add(time.Hour),
		Routings: []routing.Rule{
			rule("ok", nil),
			rule("empty", nil),
			rule("expiring", nil),
			rule("single", nil),
			rule("suspect", nil),
			rule("tags", func(r *routing.Rule) { r.Upstreams = []string{"ok"}; r.Tags = map[string]string{"tier": "gold"} }),
			rule("seq", func(r *routing.Rule) { r.Strategy = routing.Sequential; r.Upstreams = []string{"ok", "single"} }),
			rule("seqdone", func(r *routing.Rule) { r.Strategy = routing.Sequential; r.Upstreams = []string{"ok", "single"} }),
			rule("off", func(r *routing.Rule) { r.Upstreams = []string{"offup"} }),
		},
		Cursors:  map[string]int{"seq": 1, "seqdone": -1},
		Disabled: map[string]bool{"offup": true},
		Proxies: []proxy.Proxy{
			px("ok", 1, tagged), px("ok", 2),
			px("expiring", 3, soon),
			px("single", 4, func(p *proxy.Proxy) { p.MaxConcurrency = 1 }),
			px("suspect", 5, func(p *proxy.Proxy) { p.State = proxy.StateSuspect }),
			px("offup", 6),
		},
	}
	e := newEnv(t, ws, 0)
	// Hold the only slot of "single".
	held, err := e.d.Acquire(context.Background(), &dispatch.Request{Host: "single"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.d.Release(held, worker.Outcome{})
	e.clock.Add(2 * time.Minute) // "expiring" is past its usable period now

	tests := []struct {
		host    string
		exclude []proxy.ID
		want    proxy.ID
		reason  dispatch.Reason
	}{
		{host: "ok"},
		{host: "empty", reason: dispatch.ReasonEmpty},
		{host: "expiring", reason: dispatch.ReasonExpired},
		{host: "single", reason: dispatch.ReasonBusy},
		{host: "suspect", reason: dispatch.ReasonEmpty},
		{host: "tags", want: px("ok", 1).ID},
		{host: "tags", exclude: []proxy.ID{px("ok", 1).ID}, reason: dispatch.ReasonExcluded},
		{host: "ok", exclude: []proxy.ID{px("ok", 1).ID}, want: px("ok", 2).ID},
		{host: "ok", exclude: []proxy.ID{px("ok", 1).ID, px("ok", 2).ID}, reason: dispatch.ReasonExcluded},
		{host: "seq", reason: dispatch.ReasonBusy},
		{host: "seqdone", reason: dispatch.ReasonExhausted},
		{host: "off", reason: dispatch.ReasonDisabled},
	}
	for _, tc := range tests {
		name := tc.host
		if len(tc.exclude) > 0 {
			name += " excluding " + strconv.Itoa(len(tc.exclude))
		}
		t.Run(name, func(t *testing.T) {
			req := dispatch.Request{Host: tc.host}
			for _, id := range tc.exclude {
				req.AddExclude(id)
			}
			a, err := e.d.Acquire(context.Background(), &req)
			if tc.reason != 0 {
				var nc *dispatch.NoCandidateError
				if !errors.As(err, &nc) || nc.Reason != tc.reason || !errors.Is(err, dispatch.ErrNoCandidate) {
					t.Fatalf("err = %v, want reason %s", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer e.d.Release(a, worker.Outcome{})
			if tc.want != "" && a.Target.ID != tc.want {
				t.Fatalf("got %s, want %s", a.Target.ID, tc.want)
			}
		})
	}
}

func TestStaleRefusal(t *testing.T) {
	ws := gwtest.Snapshot(1, t0, px("a", 1))
	ws.ValidUntil = t0.Add(10 * time.Minute)
	tests := []struct {
		name    string
		ws      *worker.Snapshot
		advance time.Duration
		stale   bool
	}{
		{"no snapshot yet", nil, 0, true},
		{"fresh", ws, time.Minute, false},
		{"older than max stale age", ws, 3 * time.Minute, true},
		{"past valid until", ws, 11 * time.Minute, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.ws, 2*time.Minute)
			if tc.name == "past valid until" {
				e.d.SetMaxStaleAge(0)
			}
			e.clock.Add(tc.advance)
			a, err := e.d.Acquire(context.Background(), &dispatch.Request{Host: "x"})
			if got := errors.Is(err, dispatch.ErrStale); got != tc.stale {
				t.Fatalf("err = %v, want stale %v", err, tc.stale)
			}
			if a.Valid() {
				e.d.Release(a, worker.Outcome{})
			}
			if tc.stale && gwtest.Metric(t, e.prom, "proxypool_gateway_dispatch_failures_total", "reason", "stale") != 1 {
				t.Fatal("stale refusal not counted")
			}
		})
	}
}

func TestAllocationLifecycle(t *testing.T) {
	e := newEnv(t, gwtest.Snapshot(1, t0, px("a", 1)), 0)
	counts := func() (int64, int64) {
		return e.reg.Counter(px("a", 1).ID).Counts()
	}
	ctx := context.Background()

	t.Run("commit then release", func(t *testing.T) {
		a, err := e.d.Acquire(ctx, &dispatch.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if act, res := counts(); act != 0 || res != 1 {
			t.Fatalf("after acquire: active %d reserved %d", act, res)
		}
		if err := e.d.Commit(a); err != nil {
			t.Fatal(err)
		}
		if act, res := counts(); act != 1 || res != 0 {
			t.Fatalf("after commit: active %d reserved %d", act, res)
		}
		if err := e.d.Commit(a); !errors.Is(err, dispatch.ErrAllocationState) {
			t.Fatalf("second commit: %v", err)
		}
		e.d.Release(a, worker.Outcome{Success: true})
		if act, res := counts(); act != 0 || res != 0 {
			t.Fatalf("after release: active %d reserved %d", act, res)
		}
	})
	t.Run("release uncommitted", func(t *testing.T) {
		a, err := e.d.Acquire(ctx, &dispatch.Request{})
		if err != nil {
			t.Fatal(err)
		}
		e.d.Release(a, worker.Outcome{Phase: worker.PhaseDial})
		if act, res := counts(); act != 0 || res != 0 {
			t.Fatalf("after release: active %d reserved %d", act, res)
		}
		if err := e.d.Commit(a); !errors.Is(err, dispatch.ErrAllocationState) {
			t.Fatalf("commit after release: %v", err)
		}
	})
	t.Run("repeated release is counted and harmless", func(t *testing.T) {
		a, err := e.d.Acquire(ctx, &dispatch.Request{})
		if err != nil {
			t.Fatal(err)
		}
		before := gwtest.Metric(t, e.prom, "proxypool_gateway_release_errors_total")
		e.d.Release(a, worker.Outcome{})
		e.d.Release(a, worker.Outcome{})
		e.d.Release(dispatch.Allocation{}, worker.Outcome{})
		if got := gwtest.Metric(t, e.prom, "proxypool_gateway_release_errors_total") - before; got != 2 {
			t.Fatalf("release errors = %v, want 2", got)
		}
		if act, res := counts(); act != 0 || res != 0 {
			t.Fatalf("counts went negative or stuck: active %d reserved %d", act, res)
		}
	})
	t.Run("outcomes", func(t *testing.T) {
		e.out.mu.Lock()
		e.out.got = nil
		e.out.mu.Unlock()
		a, _ := e.d.Acquire(ctx, &dispatch.Request{})
		e.clock.Add(3 * time.Millisecond)
		e.d.Release(a, worker.Outcome{Phase: worker.PhaseDial})
		b, _ := e.d.Acquire(ctx, &dispatch.Request{})
		e.d.Release(b, worker.Outcome{}) // no verdict: not reported
		e.out.mu.Lock()
		defer e.out.mu.Unlock()
		if len(e.out.got) != 1 {
			t.Fatalf("outcomes = %+v", e.out.got)
		}
		o := e.out.got[0]
		if o.Proxy != px("a", 1).ID || o.Upstream != "a" || o.Routing != "default" || o.Phase != worker.PhaseDial ||
			o.Latency != 3*time.Millisecond || !o.At.Equal(e.clock.Now()) {
			t.Fatalf("outcome = %+v", o)
		}
	})
}

func TestLeastConnections(t *testing.T) {
	e := newEnv(t, gwtest.Snapshot(1, t0, px("a", 1), px("a", 2), px("a", 3)), 0)
	ctx := context.Background()
	// Load proxy 1 with two and proxy 2 with one (other holders, as far
	// as this dispatcher knows): 3 must be chosen, then 2 or 3 — never 1
	// while it is the busiest.
	load := func(id proxy.ID, n int) {
		c := e.reg.Counter(id)
		for range n {
			c.TryReserve(100)
		}
		t.Cleanup(func() {
			for range n {
				c.CancelReservation()
			}
		})
	}
	load(px("a", 1).ID, 2)
	load(px("a", 2).ID, 1)
	a, err := e.d.Acquire(ctx, &dispatch.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.d.Release(a, worker.Outcome{})
	if a.Target.ID != px("a", 3).ID {
		t.Fatalf("least connections picked %s", a.Target.ID)
	}
	// Ties break randomly: with 2 and 3 at one each, both get chosen.
	seen := map[proxy.ID]bool{}
	for range 200 {
		b, err := e.d.Acquire(ctx, &dispatch.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if b.Target.ID == px("a", 1).ID {
			t.Fatal("picked the busiest proxy")
		}
		seen[b.Target.ID] = true
		e.d.Release(b, worker.Outcome{})
	}
	if len(seen) != 2 {
		t.Fatalf("tie-break not random: %v", seen)
	}
}

func TestRuntimeReflectsAllocations(t *testing.T) {
	e := newEnv(t, gwtest.Snapshot(1, t0, px("a", 1)), 0)
	a, _ := e.d.Acquire(context.Background(), &dispatch.Request{})
	b, _ := e.d.Acquire(context.Background(), &dispatch.Request{})
	if err := e.d.Commit(b); err != nil {
		t.Fatal(err)
	}
	rt := e.reg.Runtime()
	if len(rt) != 1 || rt[0].Active != 1 || rt[0].Reserved != 1 {
		t.Fatalf("runtime = %+v", rt)
	}
	e.d.Release(a, worker.Outcome{})
	e.d.Release(b, worker.Outcome{})
	if rt := e.reg.Runtime(); len(rt) != 0 {
		t.Fatalf("runtime after release = %+v", rt)
	}
}
