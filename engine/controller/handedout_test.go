package controller

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

func handed(port uint16, expires time.Time) proxy.Proxy {
	key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: port, Username: "u"}
	return proxy.Proxy{ID: proxy.MakeID(key), Key: key, Password: "pw", ExpiresAt: expires}
}

// A handed-out proxy stays taken until it expires; when the memory is
// full the one expiring soonest is forgotten first.
func TestHandedOutExpiresAndIsBounded(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newHandedOut(2)
	a, b, c := handed(1, now.Add(time.Minute)), handed(2, now.Add(2*time.Minute)), handed(3, now.Add(3*time.Minute))
	h.add([]proxy.Proxy{a, b, handed(4, now)}, now) // 4 already expired: not kept
	if !h.taken(a.ID, now) || !h.taken(b.ID, now) || h.taken(handed(4, now).ID, now) {
		t.Fatal("taken after add")
	}
	if h.taken(a.ID, now.Add(time.Minute)) {
		t.Fatal("still taken at its expiry")
	}
	h.add([]proxy.Proxy{c}, now) // full: a, expiring soonest, goes
	if h.taken(a.ID, now) || !h.taken(b.ID, now) || !h.taken(c.ID, now) || len(h.until) != 2 {
		t.Fatalf("after overflow: %v", h.until)
	}
	h.add(nil, now.Add(2*time.Minute)) // b expired: pruned
	if len(h.until) != 1 || h.order.Len() != 1 {
		t.Fatalf("expired entries kept: %v", h.until)
	}
}

// The provider runtimes' view of the pool refuses a proxy this process
// handed out: counted as a duplicate, never admitted, even by a store that
// forgot it (here a fresh one, as Redis is after losing its state).
func TestAdmitFilterRefusesHandedOut(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	h := newHandedOut(maxHandedOut)
	a, b := handed(1, now.Add(time.Hour)), handed(2, now.Add(time.Hour))
	h.add([]proxy.Proxy{a}, now)
	pool := embedded.NewPool(embedded.PoolOptions{})
	f := admitFilter{Pool: pool, out: h, now: func() time.Time { return now }}

	a.ID = "" // the runtime may leave the ID to the store
	res, err := f.Admit(ctx, "vendor", []proxy.Proxy{a, b}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Added, []proxy.ID{b.ID}) || res.Duplicates != 1 {
		t.Fatalf("admit: %+v, want only the proxy never handed out", res)
	}
	if _, err := pool.Get(ctx, proxy.MakeID(a.Key)); err == nil {
		t.Fatal("the handed-out proxy reached the store")
	}
	res, err = f.Admit(ctx, "vendor", []proxy.Proxy{handed(1, now.Add(time.Hour))}, 10)
	if err != nil || len(res.Added) != 0 || res.Duplicates != 1 {
		t.Fatalf("admit of only handed-out proxies: %+v %v", res, err)
	}
}
