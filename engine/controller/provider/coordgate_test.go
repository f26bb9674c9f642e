package provider

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/testenv"
)

// testLeaseTTL keeps takeovers after a lapsed lease quick, and is long
// enough that a leader slowed down by -race renews in time.
const testLeaseTTL = 2 * time.Second

// requested sums the count= of every vendor request that reached the
// vendor's listener: what the vendor was asked to hand out.
type requested struct {
	sum   atomic.Int64
	calls atomic.Int64
	next  http.RoundTripper
}

func (q *requested) RoundTrip(r *http.Request) (*http.Response, error) {
	n, _ := strconv.Atoi(r.URL.Query().Get("count"))
	q.sum.Add(int64(n))
	q.calls.Add(1)
	return q.next.RoundTrip(r)
}

func (q *requested) client() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: q}
}

// redisStores opens a Redis activity pool and coordinator on their own
// client, as a separate controller process would.
func redisStores(t *testing.T, srv *testenv.Redis, ns string) (*redisstore.Pool, *redisstore.Coordinator) {
	t.Helper()
	rdb, err := redisstore.NewClient(config.Redis{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	p, err := redisstore.New(context.Background(), rdb, redisstore.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	return p, p.Coordinator()
}

// node is one controller's provider supervisor on the shared Redis.
type node struct {
	sup   *Supervisor
	pool  *redisstore.Pool
	coord *redisstore.Coordinator
	stop  func()
}

func startNode(t *testing.T, srv *testenv.Redis, ns, holder string, up config.Upstream, q *requested) *node {
	t.Helper()
	p, c := redisStores(t, srv, ns)
	s := NewSupervisor(SupervisorOptions{
		Store: p, Registry: prometheus.NewRegistry(), Tick: 10 * time.Millisecond,
		HTTPClient: q.client(), Coordinator: c, Holder: holder, LeaseTTL: testLeaseTTL,
	})
	cfg := &config.Config{Upstreams: []config.Upstream{up}, Security: config.Security{AllowLoopbackDestinations: true}}
	if err := s.Update(cfg, ctltest.Providers{"vendor": &ctltest.VendorAdapter{}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	stopped := false
	n := &node{sup: s, pool: p, coord: c, stop: func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}}
	t.Cleanup(n.stop)
	return n
}

func (n *node) status(t *testing.T) Status {
	t.Helper()
	st, _ := n.sup.Status("vendor-a")
	return st
}

// clusterUp is an upstream that keeps wanting proxies: its minimum is far
// above what the tests fetch.
func clusterUp(t *testing.T, v *testenv.Vendor) config.Upstream {
	up := upCfg(t, v.URL())
	up.Fetch.RequestInterval = time.Millisecond
	up.Pool.Minimum, up.Pool.Target, up.Pool.MaxSize = 1000, 2000, 2000
	return up
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !ctltest.Eventually(15*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestClusterOneLeaderFetchesAndFailsOver(t *testing.T) {
	srv := testenv.StartRedis(t)
	v := startVendor(t, 2000)
	up := clusterUp(t, v)
	q := &requested{next: http.DefaultTransport}
	a := startNode(t, srv, t.Name(), "ctl-a", up, q)
	b := startNode(t, srv, t.Name(), "ctl-b", up, q)

	eventually(t, "ten vendor calls", func() bool { return v.Calls() >= 10 })
	sa, sb := a.status(t), b.status(t)
	if sa.Leader == sb.Leader {
		t.Fatalf("leaders: a=%v b=%v, want exactly one", sa.Leader, sb.Leader)
	}
	leader, follower := a, b
	if sb.Leader {
		leader, follower = b, a
	}
	if st := follower.status(t); st.Calls != 0 || st.LeaderError != "" {
		t.Fatalf("the follower called the vendor or reports an error: %+v", st)
	}

	leader.stop() // releases the lease: the follower takes over at once
	before := v.Calls()
	eventually(t, "the follower to lead and fetch", func() bool {
		st := follower.status(t)
		return st.Leader && st.Calls > 0 && v.Calls() > before
	})
	follower.stop()
	// A call in flight when its runtime stops reaches the vendor but is not
	// recorded (a cancelled call is neither a success nor an error), so each
	// stop may leave up to maxInFlight calls unrecorded — never more, and
	// never a recorded call the vendor did not see.
	got, want := follower.status(t).Calls+leader.status(t).Calls, v.Calls()
	if slack := 2 * int64(max(up.Fetch.MaxInFlight, 1)); got > want || want-got > slack {
		t.Fatalf("runtimes recorded %d calls, the vendor saw %d (at most %d may be cancelled in flight)", got, want, slack)
	}
}

func TestClusterMaxTotalShared(t *testing.T) {
	srv := testenv.StartRedis(t)
	v := startVendor(t, 200)
	up := clusterUp(t, v)
	up.Fetch.MaxTotal, up.Fetch.EstimatedIPsPerCall = 23, 5
	q := &requested{next: http.DefaultTransport}
	a := startNode(t, srv, t.Name(), "ctl-a", up, q)
	b := startNode(t, srv, t.Name(), "ctl-b", up, q)

	// Hand over mid-budget: whoever leads stops after some calls.
	eventually(t, "ten proxies charged", func() bool {
		led, err := a.coord.Ledger(context.Background(), "vendor-a")
		return err == nil && led.Total >= 10
	})
	leader, other := a, b
	if b.status(t).Leader {
		leader, other = b, a
	}
	leader.stop()
	eventually(t, "maxTotal reached", func() bool {
		st := other.status(t)
		return st.Stopped == StoppedMaxTotal && st.LedgerUsed == 23 && st.InFlight == 0
	})
	// A call cut by the stop may be charged without reaching the vendor;
	// never the other way round.
	if got := q.sum.Load(); got > 23 {
		t.Fatalf("the vendor was asked for %d proxies in total, more than maxTotal 23", got)
	}
	ps, err := a.pool.List(context.Background(), activitypool.Filter{Upstream: "vendor-a"})
	if err != nil || len(ps) > 23 {
		t.Fatalf("pool holds %d proxies (%v), at most 23 allowed", len(ps), err)
	}

	// The ledger lives in Redis: a controller started later fetches nothing.
	other.stop()
	calls := v.Calls()
	c := startNode(t, srv, t.Name(), "ctl-c", up, q)
	eventually(t, "the new controller to lead", func() bool { return c.status(t).Leader })
	if st := c.status(t); st.Stopped != StoppedMaxTotal || st.LedgerUsed != 23 {
		t.Fatalf("restarted controller status %+v, want stopped at 23", st)
	}
	c.stop()
	if v.Calls() != calls {
		t.Fatalf("vendor called %d more times after maxTotal", v.Calls()-calls)
	}
}

// clusterRuntime is a runtime on a coordinated gate, driven by hand with
// Refill so a test knows exactly which cycles ran.
func clusterRuntime(t *testing.T, srv *testenv.Redis, ns, holder string, up config.Upstream, q *requested) *Runtime {
	t.Helper()
	p, c := redisStores(t, srv, ns)
	return NewRuntime(RuntimeOptions{
		Upstream: up, AllowLoopback: true, Adapter: &ctltest.VendorAdapter{}, Store: p, HTTPClient: q.client(),
		Gate: NewCoordGate(CoordOptions{Coordinator: c, Upstream: up.Name, Fetch: up.Fetch, Holder: holder, LeaseTTL: testLeaseTTL}),
		Tick: 10 * time.Millisecond,
	})
}

func refill(rts ...*Runtime) {
	for _, rt := range rts {
		rt.Refill(context.Background())
		rt.wg.Wait()
	}
}

func TestClusterRedisDownFailsClosed(t *testing.T) {
	srv := testenv.StartRedis(t)
	v := startVendor(t, 2000)
	up := clusterUp(t, v)
	q := &requested{next: http.DefaultTransport}
	a := clusterRuntime(t, srv, t.Name(), "ctl-a", up, q)
	b := clusterRuntime(t, srv, t.Name(), "ctl-b", up, q)
	eventually(t, "a vendor call", func() bool { refill(a, b); return v.Calls() > 0 })

	srv.Stop()
	for name, rt := range map[string]*Runtime{"a": a, "b": b} {
		eventually(t, name+" to report Redis down", func() bool {
			refill(rt)
			st := rt.Status()
			return !st.Leader && st.LeaderError == LeaderUnavailable
		})
	}
	calls := v.Calls()
	for range 20 {
		refill(a, b)
	}
	if v.Calls() != calls {
		t.Fatalf("%d vendor calls with Redis down", v.Calls()-calls)
	}

	srv.Start() // empty: a new generation, the old lease is void
	eventually(t, "leadership re-acquired and fetching resumed", func() bool {
		refill(a, b)
		sa, sb := a.Status(), b.Status()
		return sa.Leader != sb.Leader && sa.LeaderError == "" && sb.LeaderError == "" && v.Calls() > calls
	})
}

func TestClusterStaleLeaderFenced(t *testing.T) {
	srv := testenv.StartRedis(t)
	v := startVendor(t, 2000)
	up := clusterUp(t, v)
	q := &requested{next: http.DefaultTransport}
	a := clusterRuntime(t, srv, t.Name(), "ctl-a", up, q)
	b := clusterRuntime(t, srv, t.Name(), "ctl-b", up, q)
	_, coord := redisStores(t, srv, t.Name())
	ctx := context.Background()

	refill(a)
	if st := a.Status(); !st.Leader || st.Calls != 1 {
		t.Fatalf("a: %+v, want leader after one call", st)
	}
	// A permit of a's term, still unsettled when a stops renewing (a
	// stalled process): its lease lapses and b takes a later epoch.
	g := a.gate.Acquire(ctx, 4, time.Now())
	if g.Count != 4 {
		t.Fatalf("grant %+v", g)
	}
	epoch := a.gate.(*coordGate).lease.Epoch
	eventually(t, "b to take over", func() bool { refill(b); return b.Status().Leader })
	if e := b.gate.(*coordGate).lease.Epoch; e <= epoch {
		t.Fatalf("new term epoch %d, want above %d", e, epoch)
	}

	// The stale leader neither gets a permit nor calls the vendor.
	if g := a.gate.Acquire(ctx, 4, time.Now()); g.Count != 0 {
		t.Fatalf("stale leader granted %+v", g)
	}
	aCalls := a.Status().Calls
	refill(a)
	if st := a.Status(); st.Calls != aCalls || st.Leader {
		t.Fatalf("stale leader after a cycle: %+v", st)
	}

	// Its old permit settles exactly once.
	before, err := coord.Ledger(ctx, "vendor-a")
	if err != nil {
		t.Fatal(err)
	}
	a.gate.Settle(ctx, g, 3, true)
	a.gate.Settle(ctx, g, 3, true)
	after, err := coord.Ledger(ctx, "vendor-a")
	if err != nil {
		t.Fatal(err)
	}
	if after.Total != before.Total+3 || after.Pending != before.Pending-4 {
		t.Fatalf("ledger %+v -> %+v, want one settlement of 3 replacing 4 pending", before, after)
	}
}

func TestCoordGateLeaderErrors(t *testing.T) {
	srv := testenv.StartRedis(t)
	_, c := redisStores(t, srv, t.Name())
	up := config.Upstream{Name: "u", Fetch: config.Fetch{MaxInFlight: 1, Timeout: time.Second, EstimatedIPsPerCall: 2, MaxTotal: 10}}
	newGate := func(holder string) *coordGate {
		return NewCoordGate(CoordOptions{Coordinator: c, Upstream: "u", Fetch: up.Fetch, Holder: holder, LeaseTTL: time.Minute}).(*coordGate)
	}
	ctx := context.Background()
	a, b := newGate("a"), newGate("b")
	if !a.Lead(ctx) || b.Lead(ctx) {
		t.Fatal("want a leading, b following")
	}
	if v := b.View(ctx); v.Leader || v.LeaderError != "" {
		t.Fatalf("follower view %+v", v)
	}
	// A batch above estimatedIPsPerCall stops this upstream's fetching.
	g := a.Acquire(ctx, 2, time.Now())
	a.Settle(ctx, g, 3, true)
	if v := a.View(ctx); !v.Exhausted || v.LedgerUsed != 3 {
		t.Fatalf("after an oversized batch %+v, want exhausted", v)
	}
	if g := a.Acquire(ctx, 2, time.Now()); g.Count != 0 {
		t.Fatalf("granted %+v after an oversized batch", g)
	}
	// Releasing hands over at once.
	a.Release(ctx)
	if !b.Lead(ctx) {
		t.Fatal("b did not take over a released lease")
	}
	srv.Stop()
	// b's lease is fresh, but a failed ledger read makes it fail closed.
	if v := b.View(ctx); v.Leader || v.LeaderError != LeaderUnavailable {
		t.Fatalf("view with Redis down %+v", v)
	}
	if g := b.Acquire(ctx, 1, time.Now()); g.Count != 0 {
		t.Fatalf("granted %+v with Redis down", g)
	}
	if b.Lead(ctx) {
		t.Fatal("led with Redis down")
	}
}
