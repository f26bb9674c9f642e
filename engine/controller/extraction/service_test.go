package extraction

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/distribution"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

type noCursors struct{}

func (noCursors) Cursor(context.Context, string) (routing.Cursor, error) {
	return routing.Cursor{}, nil
}

type env struct {
	pool *embedded.Pool
	pub  *distribution.Publisher
	w    *ctltest.Worker
	svc  *Service
	ids  []proxy.ID
	now  atomic.Pointer[time.Time]
}

func defaultConfig() Config {
	return Config{MinRemainingTTL: 10 * time.Second, MaxHealthCheckAge: 5 * time.Minute, IdempotencyTTL: time.Minute, MaxCount: 100}
}

// newEnv has n AVAILABLE proxies, all published to (owned by) the worker.
func newEnv(t *testing.T, n int, cfg Config) *env {
	t.Helper()
	e := &env{w: ctltest.NewWorker()}
	e.setNow(t0)
	clock := func() time.Time { return *e.now.Load() }
	e.pool = embedded.NewPool(embedded.PoolOptions{Now: clock})
	ids, err := ctltest.AddAvailable(context.Background(), e.pool, "a", n, 50000, t0, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.ids = ids
	e.pub = distribution.New(distribution.Options{Store: e.pool, Cursors: noCursors{}, Now: clock})
	e.pub.Register("local", e.w)
	if err := e.pub.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.svc = New(Options{
		Store: e.pool, Publisher: e.pub, Now: clock, RevokeWait: 2 * time.Second,
		Workers: func() []worker.RuntimeReader { return []worker.RuntimeReader{e.w} },
	}, cfg)
	return e
}

func (e *env) setNow(t time.Time) { e.now.Store(&t) }

func req(client string, n int, f extraction.Fulfillment) extraction.Request {
	return extraction.Request{Client: client, Count: n, Fulfillment: f}
}

func TestExtractRevokesIdleOwnedFirst(t *testing.T) {
	e := newEnv(t, 3, defaultConfig())
	busy := e.ids[0]
	e.w.SetCounts(busy, 2, 0) // a gateway connection holds it for the whole test
	res, err := e.svc.Extract(context.Background(), req("c1", 2, extraction.Partial))
	if err != nil {
		t.Fatal(err)
	}
	if res.Returned != 2 {
		t.Fatalf("returned %d, want 2", res.Returned)
	}
	for _, p := range res.Proxies {
		if p.ID == busy {
			t.Fatal("extracted a proxy a gateway connection was using")
		}
		if e.w.Has(p.ID) {
			t.Fatalf("extracted proxy %s is still in the worker's snapshot", p.ID)
		}
		if p.Password == "" || p.State != proxy.StateExtracted {
			t.Fatalf("extracted proxy = %+v", p)
		}
	}
	// The gateway keeps the busy one, and later snapshots never carry an
	// extracted proxy.
	if err := e.pub.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !e.w.Has(busy) {
		t.Fatal("the busy proxy was taken from the gateway")
	}
	for _, p := range res.Proxies {
		if e.w.Has(p.ID) {
			t.Fatal("an extracted proxy was handed back to the gateway")
		}
	}
	if c := e.svc.Counters(); c.Revoked != 2 || c.Returned != 2 || c.Requests != 1 {
		t.Fatalf("counters = %+v", c)
	}
}

func TestExtractWaitsForWorkerToDrain(t *testing.T) {
	e := newEnv(t, 2, defaultConfig())
	for _, id := range e.ids {
		e.w.SetCounts(id, 1, 1)
	}
	var sawWithdrawn atomic.Bool
	// The gateway finishes its connections once a snapshot withdraws the
	// proxies: counts reach zero only after the withdrawal was applied.
	e.w.OnApply = func(s *worker.Snapshot) {
		for _, id := range e.ids {
			if !hasProxy(s, id) {
				sawWithdrawn.Store(true)
				e.w.SetCounts(id, 0, 0)
			}
		}
	}
	res, err := e.svc.Extract(context.Background(), req("c1", 2, extraction.AllOrNothing))
	if err != nil {
		t.Fatal(err)
	}
	if res.Returned != 2 || !sawWithdrawn.Load() {
		t.Fatalf("returned %d, withdrawn %v", res.Returned, sawWithdrawn.Load())
	}
}

func hasProxy(s *worker.Snapshot, id proxy.ID) bool {
	for i := range s.Proxies {
		if s.Proxies[i].ID == id {
			return true
		}
	}
	return false
}

func TestRevokeGivesUpAfterDeadline(t *testing.T) {
	e := newEnv(t, 2, defaultConfig())
	e.svc.o.RevokeWait = 50 * time.Millisecond
	e.w.SetCounts(e.ids[0], 1, 0)
	e.w.SetCounts(e.ids[1], 1, 0)
	_, err := e.svc.Extract(context.Background(), req("c1", 1, extraction.AllOrNothing))
	if !errors.Is(err, extraction.ErrInsufficient) {
		t.Fatalf("err = %v, want insufficient while every proxy stays busy", err)
	}
	if err := e.pub.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !e.w.Has(e.ids[0]) || !e.w.Has(e.ids[1]) {
		t.Fatal("proxies that could not be revoked did not return to the gateway")
	}
	if c := e.svc.Counters(); c.Insufficient != 1 {
		t.Fatalf("counters = %+v", c)
	}
}

func TestAllOrNothingShortChangesNothing(t *testing.T) {
	e := newEnv(t, 2, defaultConfig())
	_, err := e.svc.Extract(context.Background(), req("c1", 3, extraction.AllOrNothing))
	var ins *extraction.InsufficientError
	if !errors.As(err, &ins) || ins.Requested != 3 {
		t.Fatalf("err = %v", err)
	}
	// Nothing changed: no proxy was revoked from the gateway for a request
	// that could not be filled.
	for _, id := range e.ids {
		if p, _ := e.pool.Get(context.Background(), id); p.Owner != "local" || p.State != proxy.StateAvailable {
			t.Fatalf("%s after a refused allOrNothing: owner %q state %s", id, p.Owner, p.State)
		}
	}
	if c := e.svc.Counters(); c.Revoked != 0 {
		t.Fatalf("revoked %d for a request that could not be filled", c.Revoked)
	}
	if err := e.pub.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range e.ids {
		if !e.w.Has(id) {
			t.Fatalf("%s not back in the gateway's snapshot", id)
		}
	}
}

func TestConcurrentExtractionsNeverShareAProxy(t *testing.T) {
	e := newEnv(t, 10, defaultConfig())
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[proxy.ID]int{}
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.svc.Extract(context.Background(), req("c"+string(rune('0'+i)), 2, extraction.Partial))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, p := range res.Proxies {
				seen[p.ID]++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	total := 0
	for id, n := range seen {
		if n > 1 {
			t.Fatalf("%s returned %d times", id, n)
		}
		total += n
	}
	if total != 10 {
		t.Fatalf("returned %d proxies in all, want all 10", total)
	}
}

func TestValidationAndDefaults(t *testing.T) {
	cfg := defaultConfig()
	cfg.MaxCount = 3
	e := newEnv(t, 5, cfg)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		r    extraction.Request
	}{
		{"over maxCount", req("c", 4, extraction.Partial)},
		{"zero count", req("c", 0, extraction.Partial)},
		{"bad fulfillment", req("c", 1, "some")},
		{"bad protocol", extraction.Request{Client: "c", Count: 1, Filters: extraction.Filters{Protocol: "gopher"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.svc.Extract(ctx, tc.r); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("err = %v, want ErrInvalidRequest", err)
			}
		})
	}
	// minRemainingTTL from config: the proxies expire in 11 minutes; a
	// 20-minute floor makes none eligible.
	r := req("c", 1, extraction.AllOrNothing)
	r.Filters.MinRemainingTTL = 20 * time.Minute
	if _, err := e.svc.Extract(ctx, r); !errors.Is(err, extraction.ErrInsufficient) {
		t.Fatalf("err = %v, want insufficient under a TTL floor", err)
	}
	// Fulfillment defaults to partial.
	res, err := e.svc.Extract(ctx, extraction.Request{Client: "c", Count: 2})
	if err != nil || res.Returned != 2 {
		t.Fatalf("default partial = %d, %v", res.Returned, err)
	}
}

func TestReserveForGateway(t *testing.T) {
	cfg := defaultConfig()
	cfg.ReserveForGateway = 3
	e := newEnv(t, 5, cfg)
	res, err := e.svc.Extract(context.Background(), req("c", 5, extraction.Partial))
	if err != nil {
		t.Fatal(err)
	}
	if res.Returned != 2 {
		t.Fatalf("returned %d, want 2 (5 minus a gateway reserve of 3)", res.Returned)
	}
	// Only what could be extracted was revoked: the reserve stays with the
	// gateway.
	if c := e.svc.Counters(); c.Revoked != 2 {
		t.Fatalf("revoked %d, want 2", c.Revoked)
	}
	_ = e.pub.Publish(context.Background())
	if n := len(e.w.Last().Proxies); n != 3 {
		t.Fatalf("gateway keeps %d proxies, want the reserve of 3", n)
	}
}

func TestPerClientRateLimit(t *testing.T) {
	cfg := defaultConfig()
	cfg.PerClientPerMinute = 3
	e := newEnv(t, 10, cfg)
	ctx := context.Background()
	if _, err := e.svc.Extract(ctx, req("c1", 2, extraction.Partial)); err != nil {
		t.Fatal(err)
	}
	_, err := e.svc.Extract(ctx, req("c1", 2, extraction.Partial))
	var rl *RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, ErrRateLimited) || rl.RetryAfter <= 0 || rl.RetryAfter > time.Minute {
		t.Fatalf("err = %v, want a rate limit with a retry time", err)
	}
	if _, err := e.svc.Extract(ctx, req("c2", 3, extraction.Partial)); err != nil {
		t.Fatalf("another client is limited too: %v", err)
	}
	if _, err := e.svc.Extract(ctx, req("c1", 1, extraction.Partial)); err != nil {
		t.Fatalf("within the limit: %v", err)
	}
	e.setNow(t0.Add(time.Minute))
	if _, err := e.svc.Extract(ctx, req("c1", 3, extraction.Partial)); err != nil {
		t.Fatalf("a new window: %v", err)
	}
}

func TestRateLimitChargesOnlyWhatWasReturned(t *testing.T) {
	cfg := defaultConfig()
	cfg.PerClientPerMinute = 4
	e := newEnv(t, 1, cfg)
	ctx := context.Background()
	if res, err := e.svc.Extract(ctx, req("c1", 4, extraction.Partial)); err != nil || res.Returned != 1 {
		t.Fatalf("partial = %+v, %v", res, err)
	}
	if _, err := ctltest.AddAvailable(ctx, e.pool, "a", 3, 51000, t0, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := e.svc.Extract(ctx, req("c1", 3, extraction.Partial)); err != nil || res.Returned != 3 {
		t.Fatalf("the unreturned 3 were charged: %+v, %v", res, err)
	}
}

func TestRateLimiterTableIsBounded(t *testing.T) {
	l := newLimiter(2)
	for i, c := range []string{"a", "b", "c", "d"} {
		if _, ok := l.take(c, 1, 1, t0.Add(time.Duration(i)*time.Second)); !ok {
			t.Fatalf("%s refused", c)
		}
	}
	if len(l.clients) != 2 {
		t.Fatalf("client table holds %d, bound 2", len(l.clients))
	}
}

// The snapshot published to revoke gateway proxies must not hand the
// unowned proxies the extraction counted on to the gateway instead.
func TestRevokeKeepsUnownedForTheExtraction(t *testing.T) {
	for _, f := range []extraction.Fulfillment{extraction.Partial, extraction.AllOrNothing} {
		t.Run(string(f), func(t *testing.T) {
			e := newEnv(t, 3, defaultConfig())
			ctx := context.Background()
			if err := e.pool.SetOwner(ctx, e.ids[:1], ""); err != nil {
				t.Fatal(err)
			}
			res, err := e.svc.Extract(ctx, req("c1", 2, f))
			if err != nil || res.Returned != 2 {
				t.Fatalf("extract = %d proxies, %v; want 2 (one unowned, one revoked)", res.Returned, err)
			}
			got := map[proxy.ID]bool{}
			for _, p := range res.Proxies {
				got[p.ID] = true
			}
			if !got[e.ids[0]] {
				t.Fatalf("the unowned proxy was not the one extracted first: %v", got)
			}
			if c := e.svc.Counters(); c.Revoked != 1 {
				t.Fatalf("revoked %d, want only the one missing", c.Revoked)
			}
		})
	}
}

func TestIdempotentReplay(t *testing.T) {
	e := newEnv(t, 5, defaultConfig())
	ctx := context.Background()
	r := req("c1", 2, extraction.Partial)
	r.IdempotencyKey = "k1"
	first, err := e.svc.Extract(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.svc.Extract(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || len(again.Proxies) != 2 || again.Proxies[0].ID != first.Proxies[0].ID {
		t.Fatalf("replay = %+v", again)
	}
	r.Count = 3
	if _, err := e.svc.Extract(ctx, r); !errors.Is(err, extraction.ErrIdempotencyConflict) {
		t.Fatalf("err = %v, want idempotency conflict", err)
	}
	// Neither the retry nor the changed request took capacity from the
	// gateway: only the first extraction revoked (every proxy is owned).
	if c := e.svc.Counters(); c.Replays != 1 || c.Returned != 2 || c.Revoked != 2 {
		t.Fatalf("counters = %+v", c)
	}
	// The configured idempotency TTL (1 min) applies when the request
	// names none: just inside it the key still replays, past it the same
	// key is a new extraction that hands out other proxies.
	r.Count = 2
	e.setNow(t0.Add(59 * time.Second))
	if again, err := e.svc.Extract(ctx, r); err != nil || !again.Replayed {
		t.Fatalf("replay inside the TTL = %+v, %v", again, err)
	}
	e.setNow(t0.Add(61 * time.Second))
	fresh, err := e.svc.Extract(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Replayed || fresh.Returned != 2 {
		t.Fatalf("after the TTL = %+v, want a new extraction", fresh)
	}
	for _, p := range fresh.Proxies {
		if p.ID == first.Proxies[0].ID || p.ID == first.Proxies[1].ID {
			t.Fatalf("%s handed out again after the idempotency TTL", p.ID)
		}
	}
}

func TestNoPublisherExtractsUnowned(t *testing.T) {
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
	if _, err := ctltest.AddAvailable(context.Background(), pool, "a", 3, 52000, t0, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	svc := New(Options{Store: pool, Now: func() time.Time { return t0 }}, defaultConfig())
	res, err := svc.Extract(context.Background(), req("c", 3, extraction.AllOrNothing))
	if err != nil || res.Returned != 3 {
		t.Fatalf("= %+v, %v", res, err)
	}
}

func TestExpiringKeysAreBounded(t *testing.T) {
	k := newExpiring(2)
	k.put("a", t0.Add(time.Minute), t0)
	k.put("b", t0.Add(2*time.Minute), t0)
	k.put("c", t0.Add(3*time.Minute), t0) // evicts a, the first to expire
	cases := []struct {
		key  string
		at   time.Time
		live bool
	}{
		{"a", t0, false},
		{"b", t0, true},
		{"c", t0.Add(2 * time.Minute), true},
		{"c", t0.Add(3 * time.Minute), false},
	}
	for _, tc := range cases {
		t.Run(tc.key+" "+tc.at.Format(time.TimeOnly), func(t *testing.T) {
			if got := k.live(tc.key, tc.at); got != tc.live {
				t.Fatalf("live = %v, want %v", got, tc.live)
			}
		})
	}
	if len(k.keys) > 2 {
		t.Fatalf("%d keys kept, bound 2", len(k.keys))
	}
}
