package distribution

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"
	"weak"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// TestMirrorReleasesOldLists: the mirror points into the published lists
// instead of keeping a copy of its own; once a list is replaced nothing of
// the publisher may keep it alive, not even through a proxy the new list
// leaves out.
func TestMirrorReleasesOldLists(t *testing.T) {
	pool, ids := setup(t, 8)
	ctx := context.Background()
	w := ctltest.NewWorker()
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 }})
	p.Register("local", w)
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	old := weak.Make(&w.Last().Proxies[0])
	p.Exclude(ids[:1]) // left out of the next list
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if len(w.Last().Proxies) != len(ids)-1 {
		t.Fatalf("published %d proxies, want %d", len(w.Last().Proxies), len(ids)-1)
	}
	for range 3 {
		runtime.GC()
	}
	if old.Value() != nil {
		t.Fatal("the replaced list is still reachable")
	}
	runtime.KeepAlive(p)
}

// missingFeed is a change feed that never reports one proxy's changes, as
// a store rolled back past a version and written over it would not.
type missingFeed struct {
	*embedded.Pool
	hide proxy.ID
}

func (f missingFeed) Changes(ctx context.Context, since uint64, states []proxy.State) (activitypool.Changes, error) {
	ch, err := f.Pool.Changes(ctx, since, states)
	ch.Changed = slices.DeleteFunc(ch.Changed, func(p proxy.Proxy) bool { return p.ID == f.hide })
	ch.Gone = slices.DeleteFunc(ch.Gone, func(id proxy.ID) bool { return id == f.hide })
	return ch, err
}

// A mirror following a feed lists the store again every relistEvery, so
// what the feed missed is put right.
func TestMirrorRelistsPeriodically(t *testing.T) {
	pool, ids := setup(t, 4)
	ctx := context.Background()
	now := t0
	m := newMirror(missingFeed{Pool: pool, hide: ids[0]}, 100)
	m.now = func() time.Time { return now }
	has := func(id proxy.ID) bool {
		return slices.ContainsFunc(m.sorted, func(s slot) bool { return s.p.ID == id })
	}
	if err := m.sync(ctx); err != nil || !has(ids[0]) || len(m.sorted) != 4 {
		t.Fatalf("first sync: %d proxies, %v", len(m.sorted), err)
	}
	if err := pool.Transition(ctx, ids[0], proxy.StateAvailable, proxy.StateSuspect, t0); err != nil {
		t.Fatal(err)
	}
	now = now.Add(relistEvery - time.Second)
	if err := m.sync(ctx); err != nil || !has(ids[0]) {
		t.Fatalf("the feed was to hide the change: has %v, %v", has(ids[0]), err)
	}
	now = now.Add(time.Second)
	if err := m.sync(ctx); err != nil || has(ids[0]) || len(m.sorted) != 3 {
		t.Fatalf("after relistEvery: still has %s: %v (%d proxies, %v)", ids[0], has(ids[0]), len(m.sorted), err)
	}
}
