package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

func px(name string, now time.Time, usable time.Duration) proxy.Proxy {
	return proxy.Proxy{
		Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: name + ".example", Port: 3128, Username: "u"},
		Password:       "pw-" + name,
		ExpiresAt:      now.Add(usable + time.Minute),
		UsableUntil:    now.Add(usable),
		MaxConcurrency: 2,
		Region:         "eu",
	}
}

func batch(prefix string, n int, now time.Time) []proxy.Proxy {
	ps := make([]proxy.Proxy, n)
	for i := range ps {
		ps[i] = px(fmt.Sprintf("%s-%d", prefix, i), now, time.Hour)
	}
	return ps
}

// available admits ps under up and moves them to AVAILABLE.
func available(t testing.TB, p *redisstore.Pool, up string, ps ...proxy.Proxy) []proxy.ID {
	t.Helper()
	ctx := context.Background()
	res, err := p.Admit(ctx, up, ps, 0)
	if err != nil || len(res.Added) != len(ps) {
		t.Fatalf("admit %d: %+v, %v", len(ps), res, err)
	}
	now := time.Now()
	for _, id := range res.Added {
		if err := p.Transition(ctx, id, proxy.StateFetched, proxy.StateChecking, now); err != nil {
			t.Fatal(err)
		}
		if err := p.RecordHealth(ctx, activitypool.Health{ID: id, From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: now, Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	return res.Added
}

// within runs f and fails the test if it does not return before limit: the
// guard against an operation hanging on an unreachable server.
func within[T any](t *testing.T, limit time.Duration, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(limit):
		t.Fatalf("%s did not return within %s", what, limit)
		panic("unreachable")
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(limit)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %s", what, limit)
		}
	}
}
