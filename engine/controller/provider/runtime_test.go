package provider

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/testenv"
)

func vendorProxies(n, base int) []testenv.VendorProxy {
	out := make([]testenv.VendorProxy, n)
	for i := range out {
		out[i] = testenv.VendorProxy{Host: "127.0.0.1", Port: base + i, Username: "u", Password: "pw-secret"}
	}
	return out
}

func startVendor(t *testing.T, n int) *testenv.Vendor {
	t.Helper()
	v, err := testenv.NewVendor(testenv.VendorConfig{Proxies: vendorProxies(n, 20000), APIKey: "k-123", SlowDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	return v
}

func upCfg(t *testing.T, vendorURL string) config.Upstream {
	t.Helper()
	t.Setenv("PROXYPOOL_TEST_VENDOR_KEY", "k-123")
	key, err := config.ParseSecretRef("env:PROXYPOOL_TEST_VENDOR_KEY")
	if err != nil {
		t.Fatal(err)
	}
	if err := key.Resolve(); err != nil {
		t.Fatal(err)
	}
	return config.Upstream{
		Name: "vendor-a",
		Provider: config.Provider{
			Plugin:  "vendor",
			Params:  config.StringMap{"url": vendorURL + "/v1/proxies"},
			Secrets: map[string]config.Secret{"apiKey": key},
		},
		Fetch: config.Fetch{
			RequestInterval: time.Microsecond, Timeout: 5 * time.Second, MaxInFlight: 1,
			EstimatedIPsPerCall: 5, EmptyThreshold: 2, MaxResponseBytes: 1 << 20,
			Backoff: config.Backoff{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond},
		},
		Pool: config.Pool{Minimum: 3, Target: 6, MaxSize: 50, DefaultTTL: 5 * time.Minute, AllocationSafetyMargin: 10 * time.Second, MaxConcurrency: 8},
		Tags: config.StringMap{"tier": "test"},
	}
}

type hooks struct {
	depleted atomic.Int64
	// failDepleted makes the Depleted hook fail (the management store is
	// down), counting the attempts.
	failDepleted atomic.Bool
	attempts     atomic.Int64
	mu           sync.Mutex
	admitted     []proxy.ID
}

func (h *hooks) onDepleted(context.Context, string) error {
	h.attempts.Add(1)
	if h.failDepleted.Load() {
		return errors.New("management store down")
	}
	h.depleted.Add(1)
	return nil
}
func (h *hooks) onAdmitted(_ context.Context, _ string, ids []proxy.ID) {
	h.mu.Lock()
	h.admitted = append(h.admitted, ids...)
	h.mu.Unlock()
}

type fixture struct {
	rt    *Runtime
	pool  *embedded.Pool
	hooks *hooks
	reg   *prometheus.Registry
}

func newFixture(t *testing.T, up config.Upstream, adapter upstream.Adapter, mutate func(*RuntimeOptions)) *fixture {
	t.Helper()
	f := &fixture{pool: embedded.NewPool(embedded.PoolOptions{}), hooks: &hooks{}, reg: prometheus.NewRegistry()}
	if adapter == nil {
		adapter = &ctltest.VendorAdapter{}
	}
	o := RuntimeOptions{
		Upstream: up, AllowLoopback: true, Adapter: adapter, Store: f.pool,
		Metrics: NewMetrics(f.reg), Depleted: f.hooks.onDepleted, Admitted: f.hooks.onAdmitted,
		Jitter: func() float64 { return 0.5 },
	}
	if mutate != nil {
		mutate(&o)
	}
	f.rt = NewRuntime(o)
	return f
}

func (f *fixture) list(t *testing.T) []proxy.Proxy {
	t.Helper()
	ps, err := f.pool.List(context.Background(), activitypool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestFetchSuccessConvertsCandidates(t *testing.T) {
	v := startVendor(t, 10)
	f := newFixture(t, upCfg(t, v.URL()), nil, nil)
	before := time.Now()
	f.rt.fetch(context.Background(), Grant{Count: 3})
	st := f.rt.Status()
	if st.LastOutcome != "success" || st.Success != 1 || st.TotalFetched != 3 {
		t.Fatalf("status = %+v", st)
	}
	ps := f.list(t)
	if len(ps) != 3 {
		t.Fatalf("pool has %d proxies, want 3", len(ps))
	}
	for _, p := range ps {
		if p.State != proxy.StateFetched || p.Upstream != "vendor-a" || p.MaxConcurrency != 8 || p.Password != "pw-secret" {
			t.Fatalf("converted proxy = %+v", p)
		}
		if p.ID != proxy.MakeID(p.Key) {
			t.Fatalf("ID %q is not MakeID(key)", p.ID)
		}
		if got := p.ExpiresAt.Sub(p.UsableUntil); got != 10*time.Second {
			t.Fatalf("UsableUntil is %s before ExpiresAt, want the safety margin 10s", got)
		}
		if p.ExpiresAt.Before(before.Add(9*time.Minute)) || p.Tags["tier"] != "test" {
			t.Fatalf("vendor ttl or upstream tags not applied: %+v", p)
		}
	}
	if len(f.hooks.admitted) != 3 {
		t.Fatalf("admitted hook got %d ids", len(f.hooks.admitted))
	}
	if got := testutil.ToFloat64(f.rt.o.Metrics.fetches.WithLabelValues("vendor-a", "success")); got != 1 {
		t.Fatalf("fetch_total{success} = %v", got)
	}
	if got := testutil.ToFloat64(f.rt.o.Metrics.fetched.WithLabelValues("vendor-a")); got != 3 {
		t.Fatalf("fetched_proxies_total = %v", got)
	}
}

func TestFetchOutcomeClasses(t *testing.T) {
	cases := []struct {
		name        string
		mode        testenv.VendorMode
		maxBody     int64
		count       int
		wantOutcome upstream.Outcome
		wantErr     string
		minBackoff  time.Duration
	}{
		{name: "500 is error", mode: testenv.VendorError500, count: 3, wantOutcome: upstream.Error, wantErr: "HTTP 500", minBackoff: 10 * time.Millisecond},
		{name: "401 is error", mode: testenv.VendorAuthRequired, count: 3, wantOutcome: upstream.Error, wantErr: "HTTP 401"},
		{name: "malformed is error", mode: testenv.VendorMalformed, count: 3, wantOutcome: upstream.Error, wantErr: "parsing provider response"},
		{name: "429 honours Retry-After", mode: testenv.VendorRateLimited, count: 3, wantOutcome: upstream.Error, wantErr: "HTTP 429", minBackoff: 2 * time.Second},
		{name: "oversize is error", mode: testenv.VendorNormal, count: 50, maxBody: 1024, wantOutcome: upstream.Error, wantErr: "response larger than maxResponseBytes"},
		{name: "empty", mode: testenv.VendorEmpty, count: 3, wantOutcome: upstream.Empty},
		{name: "duplicate only", mode: testenv.VendorDuplicateOnly, count: 3, wantOutcome: upstream.DuplicateOnly},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := startVendor(t, 60)
			up := upCfg(t, v.URL())
			if tc.maxBody > 0 {
				up.Fetch.MaxResponseBytes = tc.maxBody
			}
			f := newFixture(t, up, nil, nil)
			ctx := context.Background()
			// Seed the pool: the first batch is what duplicate-only repeats,
			// and what a failing call must leave untouched.
			f.rt.fetch(ctx, Grant{Count: 3})
			seeded := f.list(t)
			if len(seeded) != 3 {
				t.Fatalf("seed fetch admitted %d", len(seeded))
			}
			v.SetMode(tc.mode)
			now := time.Now()
			f.rt.fetch(ctx, Grant{Count: tc.count})
			st := f.rt.Status()
			if st.LastOutcome != tc.wantOutcome.String() {
				t.Fatalf("outcome = %s (%s), want %s", st.LastOutcome, st.LastError, tc.wantOutcome)
			}
			if tc.wantErr != "" && !strings.Contains(st.LastError, tc.wantErr) {
				t.Fatalf("last error %q does not mention %q", st.LastError, tc.wantErr)
			}
			if strings.Contains(st.LastError, "k-123") {
				t.Fatalf("error leaks the API key: %q", st.LastError)
			}
			if tc.wantOutcome == upstream.Error {
				if st.ConsecutiveErrors != 1 || st.ConsecutiveEmpty != 0 {
					t.Fatalf("counters = %+v", st)
				}
				if got := st.BackoffUntil.Sub(now); got < tc.minBackoff {
					t.Fatalf("backoff %s, want at least %s", got, tc.minBackoff)
				}
				if got := f.list(t); !reflect.DeepEqual(got, seeded) {
					t.Fatal("a failed call changed the existing proxies")
				}
			}
			if tc.mode == testenv.VendorRateLimited {
				if got := testutil.ToFloat64(f.rt.o.Metrics.http429.WithLabelValues("vendor-a")); got != 1 {
					t.Fatalf("http_429_total = %v", got)
				}
				// While backing off, a refill cycle makes no call.
				calls := v.Calls()
				if d := f.rt.Refill(ctx); d <= 0 {
					t.Fatalf("refill during backoff returned %s", d)
				}
				f.rt.wg.Wait()
				if v.Calls() != calls {
					t.Fatal("a call was made during the Retry-After backoff")
				}
			}
		})
	}
}

func TestEmptyThresholdFiresOnceAndDuplicateResets(t *testing.T) {
	v := startVendor(t, 10)
	f := newFixture(t, upCfg(t, v.URL()), nil, nil) // emptyThreshold 2
	ctx := context.Background()
	f.rt.fetch(ctx, Grant{Count: 3})
	v.SetMode(testenv.VendorEmpty)
	f.rt.fetch(ctx, Grant{Count: 3})
	if f.hooks.depleted.Load() != 0 {
		t.Fatal("depleted before the threshold")
	}
	v.SetMode(testenv.VendorDuplicateOnly)
	f.rt.fetch(ctx, Grant{Count: 3})
	if st := f.rt.Status(); st.ConsecutiveEmpty != 0 || st.LastOutcome != "duplicate_only" {
		t.Fatalf("duplicate-only must reset the empty run: %+v", st)
	}
	v.SetMode(testenv.VendorEmpty)
	f.rt.fetch(ctx, Grant{Count: 3})
	v.SetMode(testenv.VendorError500)
	f.rt.fetch(ctx, Grant{Count: 3}) // an error in between neither counts nor resets
	v.SetMode(testenv.VendorEmpty)
	f.rt.fetch(ctx, Grant{Count: 3})
	if got := f.hooks.depleted.Load(); got != 1 {
		t.Fatalf("depleted fired %d times at the threshold, want 1", got)
	}
	f.rt.fetch(ctx, Grant{Count: 3})
	f.rt.fetch(ctx, Grant{Count: 3})
	if got := f.hooks.depleted.Load(); got != 1 {
		t.Fatalf("depleted fired %d times past the threshold, want 1", got)
	}
	if st := f.rt.Status(); st.ConsecutiveEmpty != 4 || st.Empty != 5 {
		t.Fatalf("status = %+v", st)
	}
}

func TestBackoffGrowsWithJitterBounds(t *testing.T) {
	up := upCfg(t, "http://127.0.0.1:1")
	up.Fetch.Backoff = config.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for _, tc := range []struct {
		jitter float64
		errs   int
		want   time.Duration
	}{
		{0, 1, 100 * time.Millisecond},
		{0.999999, 1, 100 * time.Millisecond},
		{1, 2, 200 * time.Millisecond},
		{0.5, 3, 250 * time.Millisecond},
		{1, 10, time.Second},
		{0, 10, 100 * time.Millisecond},
	} {
		f := newFixture(t, up, nil, func(o *RuntimeOptions) { o.Jitter = func() float64 { return tc.jitter } })
		if got := f.rt.backoff(tc.errs); got.Round(time.Millisecond) != tc.want {
			t.Errorf("backoff(errs=%d, jitter=%v) = %s, want %s", tc.errs, tc.jitter, got, tc.want)
		}
	}
}

func TestLoopbackCandidatesRefusedWhenNotAllowed(t *testing.T) {
	v := startVendor(t, 5)
	// The vendor itself is on loopback, so this test uses a plain client;
	// the guard on candidates is what is under test.
	f := newFixture(t, upCfg(t, v.URL()), nil, func(o *RuntimeOptions) {
		o.AllowLoopback = false
		o.HTTPClient = &http.Client{Timeout: 5 * time.Second}
	})
	f.rt.fetch(context.Background(), Grant{Count: 5})
	if n := len(f.list(t)); n != 0 {
		t.Fatalf("%d loopback candidates became proxies", n)
	}
	if st := f.rt.Status(); st.LastOutcome != "empty" {
		t.Fatalf("outcome = %s, want empty (no valid candidate)", st.LastOutcome)
	}
	if got := testutil.ToFloat64(f.rt.o.Metrics.rejected.WithLabelValues("vendor-a")); got != 5 {
		t.Fatalf("rejected_candidates_total = %v", got)
	}
}

func TestVendorOnLoopbackRefusedByGuard(t *testing.T) {
	v := startVendor(t, 5)
	up := upCfg(t, v.URL())
	up.Fetch.MaxTotal = 100
	f := newFixture(t, up, nil, func(o *RuntimeOptions) { o.AllowLoopback = false })
	f.rt.o.Ledger.Reserve(5)
	f.rt.fetch(context.Background(), Grant{Count: 5})
	st := f.rt.Status()
	if st.LastOutcome != "error" || !strings.Contains(st.LastError, "not allowed") {
		t.Fatalf("status = %+v, want a refused destination", st)
	}
	if v.Calls() != 0 {
		t.Fatal("the vendor was reached")
	}
	if st.LedgerUsed != 0 {
		t.Fatalf("a call never sent was charged %d", st.LedgerUsed)
	}
}

func TestCheckCandidateHost(t *testing.T) {
	cases := []struct {
		host          string
		allowLoopback bool
		ok            bool
	}{
		{"203.0.113.7", false, true},
		{"proxy.example.com", false, true},
		{"127.0.0.1", false, false},
		{"127.0.0.1", true, true},
		{"::1", false, false},
		{"[::ffff:127.0.0.1]", false, false},
		{"localhost", false, false},
		{"LOCALHOST.", false, false},
		{"localhost", true, true},
		{"10.1.2.3", true, false},
		{"192.168.0.1", true, false},
		{"169.254.169.254", true, false},
		{"100.64.0.1", false, false},
		{"0.0.0.0", true, false},
		{"224.0.0.1", false, false},
		{"fe80::1%eth0", true, false},
		{"2130706433", false, false},
		{"0x7f.1", false, false},
		{"127.1", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.host, func(t *testing.T) {
			err := checkCandidateHost(tc.host, tc.allowLoopback)
			if (err == nil) != tc.ok {
				t.Fatalf("checkCandidateHost(%q, %v) = %v, want ok=%v", tc.host, tc.allowLoopback, err, tc.ok)
			}
		})
	}
}

func TestLedger(t *testing.T) {
	l := NewLedger(10)
	if g := l.Reserve(4); g != 4 {
		t.Fatalf("grant %d", g)
	}
	if g := l.Reserve(8); g != 6 {
		t.Fatalf("grant %d, want the 6 left", g)
	}
	if g := l.Reserve(1); g != 0 {
		t.Fatal("over-reserved")
	}
	l.Settle(4, 1, true, 5)  // certain: charged actual
	l.Settle(6, 0, false, 5) // uncertain: charged expected
	if l.Used() != 7 || l.Exhausted() {
		t.Fatalf("used %d exhausted %v", l.Used(), l.Exhausted())
	}
	if g := l.Reserve(5); g != 3 {
		t.Fatalf("grant %d, want 3", g)
	}
	l.Settle(3, 3, true, 5)
	if !l.Exhausted() {
		t.Fatal("ledger not exhausted at its limit")
	}

	big := NewLedger(100)
	big.Reserve(2)
	big.Settle(2, 9, true, 2) // a batch above estimatedIPsPerCall
	if big.Used() != 9 || !big.Exhausted() || big.Reserve(1) != 0 {
		t.Fatal("an oversized batch must be charged as returned and stop further calls")
	}
	unlimited := NewLedger(0)
	unlimited.Reserve(1000)
	unlimited.Settle(1000, 5000, true, 1)
	if unlimited.Exhausted() {
		t.Fatal("maxTotal 0 is unlimited")
	}
}

func refillUntilIdle(t *testing.T, f *fixture, maxCycles int) {
	t.Helper()
	ctx := context.Background()
	for range maxCycles {
		calls := f.rt.Status().Calls
		f.rt.Refill(ctx)
		f.rt.wg.Wait()
		if f.rt.Status().Calls == calls {
			return
		}
	}
}

func TestMaxTotalStopsFetching(t *testing.T) {
	v := startVendor(t, 40)
	up := upCfg(t, v.URL())
	up.Fetch.MaxTotal = 7
	up.Fetch.EstimatedIPsPerCall = 3
	up.Pool = config.Pool{Minimum: 20, Target: 30, MaxSize: 50, DefaultTTL: 5 * time.Minute, AllocationSafetyMargin: time.Second, MaxConcurrency: 1}
	f := newFixture(t, up, nil, nil)
	refillUntilIdle(t, f, 10)
	st := f.rt.Status()
	if st.Stopped != StoppedMaxTotal || st.LedgerUsed != 7 {
		t.Fatalf("status = %+v, want stopped at maxTotal 7", st)
	}
	if v.Calls() != 3 || len(f.list(t)) != 7 {
		t.Fatalf("vendor calls %d (want 3: 3+3+1), pool %d (want 7)", v.Calls(), len(f.list(t)))
	}
}

func TestMaxTotalChargesUncertainAndOversized(t *testing.T) {
	t.Run("malformed charged as expected", func(t *testing.T) {
		v := startVendor(t, 40)
		v.SetMode(testenv.VendorMalformed)
		up := upCfg(t, v.URL())
		up.Fetch.MaxTotal = 100
		up.Fetch.EstimatedIPsPerCall = 4
		f := newFixture(t, up, nil, nil)
		f.rt.Refill(context.Background())
		f.rt.wg.Wait()
		if got := f.rt.Status().LedgerUsed; got != 4 {
			t.Fatalf("ledger used %d, want the expected 4", got)
		}
	})
	t.Run("batch above estimate stops", func(t *testing.T) {
		v := startVendor(t, 40)
		up := upCfg(t, v.URL())
		up.Fetch.MaxTotal = 100
		up.Fetch.EstimatedIPsPerCall = 2
		f := newFixture(t, up, &ctltest.VendorAdapter{FixedCount: 9}, nil)
		refillUntilIdle(t, f, 5)
		st := f.rt.Status()
		if st.LedgerUsed != 9 || st.Stopped != StoppedMaxTotal || v.Calls() != 1 {
			t.Fatalf("status = %+v calls=%d; want 9 charged, stopped after one call", st, v.Calls())
		}
	})
}

func TestPlanDrivenRefillReachesTargetAndStops(t *testing.T) {
	v := startVendor(t, 40)
	up := upCfg(t, v.URL()) // minimum 3, target 6, 5 per call
	f := newFixture(t, up, nil, nil)
	refillUntilIdle(t, f, 10)
	if n := len(f.list(t)); n != 6 {
		t.Fatalf("pool has %d, want target 6", n)
	}
	if v.Calls() != 2 {
		t.Fatalf("vendor calls %d, want 2 (5 + 1)", v.Calls())
	}
	// Above minimum: hysteresis keeps the provider idle.
	f.rt.Refill(context.Background())
	f.rt.wg.Wait()
	if v.Calls() != 2 {
		t.Fatal("fetched although inventory is above minimum")
	}
}

func TestRequestIntervalEnforced(t *testing.T) {
	v := startVendor(t, 40)
	up := upCfg(t, v.URL())
	up.Fetch.RequestInterval = time.Hour
	up.Fetch.EstimatedIPsPerCall = 1
	f := newFixture(t, up, nil, nil)
	ctx := context.Background()
	f.rt.Refill(ctx)
	f.rt.wg.Wait()
	d := f.rt.Refill(ctx)
	f.rt.wg.Wait()
	if v.Calls() != 1 {
		t.Fatalf("vendor calls %d within one requestInterval", v.Calls())
	}
	if d < 59*time.Minute {
		t.Fatalf("next cycle in %s, want about the request interval", d)
	}
}

func TestConcurrentSignalsNeverStackCalls(t *testing.T) {
	v := startVendor(t, 40)
	v.SetMode(testenv.VendorSlow) // 300ms per call
	up := upCfg(t, v.URL())
	f := newFixture(t, up, nil, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.rt.Signal()
			f.rt.Refill(ctx)
		}()
	}
	wg.Wait()
	f.rt.wg.Wait()
	if v.Calls() != 1 {
		t.Fatalf("32 concurrent refills made %d calls with maxInFlight 1, want 1", v.Calls())
	}
}

func TestCancelledCallIsNotClassified(t *testing.T) {
	v := startVendor(t, 10)
	v.SetMode(testenv.VendorSlow)
	f := newFixture(t, upCfg(t, v.URL()), nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	f.rt.Refill(ctx)
	if !ctltest.Eventually(5*time.Second, func() bool { return v.Calls() == 1 }) {
		t.Fatal("call not made")
	}
	cancel()
	f.rt.wg.Wait()
	if st := f.rt.Status(); st.Calls != 0 || st.Errors != 0 || st.Empty != 0 {
		t.Fatalf("a cancelled call was classified: %+v", st)
	}
}

func TestRunRefillsOnSignal(t *testing.T) {
	v := startVendor(t, 40)
	f := newFixture(t, upCfg(t, v.URL()), nil, func(o *RuntimeOptions) { o.Tick = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.rt.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !ctltest.Eventually(5*time.Second, func() bool { return len(f.list(t)) == 6 }) {
		t.Fatalf("pool has %d, want 6", len(f.list(t)))
	}
	// Drop inventory below minimum: remove 4 (EXPIRED via the state machine).
	ctxb := context.Background()
	for _, p := range f.list(t)[:4] {
		for _, step := range [][2]proxy.State{{proxy.StateFetched, proxy.StateChecking}, {proxy.StateChecking, proxy.StateUnhealthy}} {
			if err := f.pool.Transition(ctxb, p.ID, step[0], step[1], time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.pool.Remove(ctxb, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	f.rt.Signal()
	if !ctltest.Eventually(5*time.Second, func() bool { return len(f.list(t)) == 6 }) {
		t.Fatalf("after a signal the pool has %d, want refilled to 6", len(f.list(t)))
	}
}
