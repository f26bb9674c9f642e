package extraction

import (
	"context"
	"errors"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/testenv"
)

// clusterEnv is a controller's extraction over 10 proxies whose
// perClientPerMinute budget lives in the Redis at srv, as in a cluster.
func clusterEnv(t *testing.T, srv *testenv.Redis, cfg Config) *env {
	t.Helper()
	e := newEnv(t, 10, cfg)
	rdb, err := redisstore.NewClient(config.Redis{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	p, err := redisstore.New(context.Background(), rdb, redisstore.Options{Namespace: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	e.svc = New(Options{
		Store: e.pool, Publisher: e.pub, Now: time.Now, Limiter: p.Coordinator(),
		Workers: func() []worker.RuntimeReader { return []worker.RuntimeReader{e.w} },
	}, cfg)
	return e
}

// Two controllers on one Redis share a client's perClientPerMinute; with
// Redis down an extraction is refused, never let through unlimited.
func TestPerClientRateLimitSharedInCluster(t *testing.T) {
	srv := testenv.StartRedis(t)
	cfg := defaultConfig()
	cfg.PerClientPerMinute = 5
	a, b := clusterEnv(t, srv, cfg), clusterEnv(t, srv, cfg)
	ctx := context.Background()
	if res, err := a.svc.Extract(ctx, req("c1", 3, extraction.Partial)); err != nil || res.Returned != 3 {
		t.Fatalf("first extraction %+v, %v", res, err)
	}
	_, err := b.svc.Extract(ctx, req("c1", 3, extraction.Partial))
	var rl *RateLimitError
	if !errors.As(err, &rl) || rl.RetryAfter <= 0 || rl.RetryAfter > time.Minute {
		t.Fatalf("3 + 3 > 5 on another controller: %v, want a rate limit", err)
	}
	if res, err := b.svc.Extract(ctx, req("c1", 2, extraction.Partial)); err != nil || res.Returned != 2 {
		t.Fatalf("within the shared limit: %+v, %v", res, err)
	}
	if res, err := b.svc.Extract(ctx, req("c2", 5, extraction.Partial)); err != nil || res.Returned != 5 {
		t.Fatalf("another client: %+v, %v", res, err)
	}
	if _, err := a.svc.Extract(ctx, req("c3", 6, extraction.Partial)); !errors.As(err, &rl) {
		t.Fatalf("more than the whole budget at once: %v, want a rate limit", err)
	}

	srv.Stop()
	before := len(b.w.Last().Proxies)
	_, err = b.svc.Extract(ctx, req("c4", 1, extraction.Partial))
	if err == nil || errors.Is(err, ErrRateLimited) || !errors.Is(err, redisstore.ErrUnavailable) {
		t.Fatalf("Redis down: %v, want a store failure", err)
	}
	if c := b.svc.Counters(); c.Returned != 7 {
		t.Fatalf("returned %d in total, want 7: nothing with Redis down", c.Returned)
	}
	if after := len(b.w.Last().Proxies); after != before {
		t.Fatalf("the gateway lost %d proxies to a refused extraction", before-after)
	}
}

// The shared budget counts proxies handed out: what an extraction asked
// for and did not get is given back, as in-process.
func TestSharedRateLimitRefundsWhatWasNotReturned(t *testing.T) {
	srv := testenv.StartRedis(t)
	cfg := defaultConfig()
	cfg.PerClientPerMinute = 12
	e := clusterEnv(t, srv, cfg)
	ctx := context.Background()
	if res, err := e.svc.Extract(ctx, req("c1", 12, extraction.Partial)); err != nil || res.Returned != 10 {
		t.Fatalf("12 asked of 10: %+v, %v", res, err)
	}
	// 10 handed out of 12: 2 left. Asking 2 must pass the limit (and find
	// the pool empty); without the refund it would be rate limited.
	res, err := e.svc.Extract(ctx, req("c1", 2, extraction.Partial))
	var rl *RateLimitError
	if err != nil || res.Returned != 0 {
		t.Fatalf("2 more within the refunded budget: %+v, %v, want none returned", res, err)
	}
	// That call handed out nothing and was refunded too: 2
	// are still left, 3 are not.
	if _, err := e.svc.Extract(ctx, req("c1", 3, extraction.Partial)); !errors.As(err, &rl) {
		t.Fatalf("3 more with 2 left: %v, want a rate limit", err)
	}
}
