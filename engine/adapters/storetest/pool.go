package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// RunPoolContract runs the activity-pool contract against fresh pools made
// by newPool (one per subtest; the factory registers its own cleanup).
//
// The contract, beyond the interface comments:
//   - IDs are proxy.MakeID(Key); Admit derives an empty one and refuses a
//     mismatching one, changing nothing.
//   - A key's lifecycle ends when its entry is EXPIRED or REMOVED or its
//     ExpiresAt has passed (by the store clock); only then may any upstream
//     admit it again. Until then a re-admission is a duplicate that changes
//     nothing. maxSize <= 0 means no per-upstream bound.
//   - Managed counts every state but EXTRACTED, EXPIRED and REMOVED.
//   - Transition validates the edge first (*proxy.TransitionError), then
//     the ID (ErrNotFound), then the current state (ErrConflict).
//   - RecordHealth with From == To records an observation without moving;
//     Latency and LastSuccessAt change on success only.
//   - Remove deletes from EXPIRED, UNHEALTHY or REMOVED; other states get a
//     *proxy.TransitionError.
//   - SetOwner is all or nothing; assigning needs AVAILABLE and no other
//     owner; clearing works in any state.
//   - Extraction order is UsableUntil descending. reserveForGateway counts
//     usable AVAILABLE proxies, owned or not, over the request's upstream
//     filter. A failed allOrNothing records no idempotency result. The
//     upstream filter is a set: its order does not change the fingerprint.
//   - Every returned Proxy is a copy.
//
// Times are taken from the wall clock with hours of margin, so the suite
// runs unchanged against stores whose clock is a server's.
func RunPoolContract(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	t.Helper()
	t.Run("Admit", func(t *testing.T) { testAdmit(t, newPool) })
	t.Run("Get", func(t *testing.T) { testGet(t, newPool) })
	t.Run("Transition", func(t *testing.T) { testTransition(t, newPool) })
	t.Run("RecordHealth", func(t *testing.T) { testRecordHealth(t, newPool) })
	t.Run("Remove", func(t *testing.T) { testRemove(t, newPool) })
	t.Run("SetOwner", func(t *testing.T) { testSetOwner(t, newPool) })
	t.Run("List", func(t *testing.T) { testList(t, newPool) })
	t.Run("Counts", func(t *testing.T) { testCounts(t, newPool) })
	t.Run("Inventory", func(t *testing.T) { testInventory(t, newPool) })
	t.Run("Extract", func(t *testing.T) { testExtract(t, newPool) })
	t.Run("ExtractFilters", func(t *testing.T) { testExtractFilters(t, newPool) })
	t.Run("ReserveForGateway", func(t *testing.T) { testReserve(t, newPool) })
	t.Run("Fulfillment", func(t *testing.T) { testFulfillment(t, newPool) })
	t.Run("Idempotency", func(t *testing.T) { testIdempotency(t, newPool) })
	t.Run("ConcurrentExtract", func(t *testing.T) { testConcurrentExtract(t, newPool) })
}

// fixture wraps one pool with a fixed reference time.
type fixture struct {
	t   *testing.T
	p   activitypool.Pool
	ctx context.Context
	now time.Time
}

func newFixture(t *testing.T, newPool func(t *testing.T) activitypool.Pool) *fixture {
	t.Helper()
	// Millisecond precision and UTC: what a networked store round-trips.
	return &fixture{t: t, p: newPool(t), ctx: context.Background(), now: time.Now().UTC().Truncate(time.Millisecond)}
}

// px builds a proxy named name: http, region eu, carrier c1, one hour of
// TTL and 55 minutes usable, 4 slots.
func (f *fixture) px(name string, mods ...func(*proxy.Proxy)) proxy.Proxy {
	p := proxy.Proxy{
		Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: name + ".example", Port: 8080, Username: "user"},
		Password:       "pw-" + name,
		ExpiresAt:      f.now.Add(time.Hour),
		UsableUntil:    f.now.Add(55 * time.Minute),
		MaxConcurrency: 4,
		Region:         "eu",
		Carrier:        "c1",
		Tags:           map[string]string{"name": name},
	}
	for _, m := range mods {
		m(&p)
	}
	return p
}

// with returns the fixture bound to a subtest's t, so failures stop the
// right goroutine.
func (f *fixture) with(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
}

func idOf(p proxy.Proxy) proxy.ID { return proxy.MakeID(p.Key) }

// admit admits ps under up with no maxSize and requires all to be added.
func (f *fixture) admit(up string, ps ...proxy.Proxy) []proxy.ID {
	f.t.Helper()
	res, err := f.p.Admit(f.ctx, up, ps, 0)
	if err != nil {
		f.t.Fatalf("admit %d to %s: %v", len(ps), up, err)
	}
	if len(res.Added) != len(ps) {
		f.t.Fatalf("admit to %s: added %d of %d (%+v)", up, len(res.Added), len(ps), res)
	}
	return res.Added
}

// paths lead from FETCHED to every state through legal edges.
var paths = map[proxy.State][]proxy.State{
	proxy.StateFetched:   nil,
	proxy.StateChecking:  {proxy.StateChecking},
	proxy.StateAvailable: {proxy.StateChecking, proxy.StateAvailable},
	proxy.StateSuspect:   {proxy.StateChecking, proxy.StateAvailable, proxy.StateSuspect},
	proxy.StateUnhealthy: {proxy.StateChecking, proxy.StateUnhealthy},
	proxy.StateDraining:  {proxy.StateChecking, proxy.StateAvailable, proxy.StateDraining},
	proxy.StateExtracted: {proxy.StateChecking, proxy.StateAvailable, proxy.StateExtracted},
	proxy.StateExpired:   {proxy.StateChecking, proxy.StateAvailable, proxy.StateDraining, proxy.StateExpired},
	proxy.StateRemoved:   {proxy.StateChecking, proxy.StateUnhealthy, proxy.StateRemoved},
}

// drive moves a FETCHED proxy to state to. CHECKING -> AVAILABLE goes
// through a successful health record at checkedAt so LastSuccessAt is set.
func (f *fixture) drive(id proxy.ID, to proxy.State, checkedAt time.Time) {
	f.t.Helper()
	from := proxy.StateFetched
	for _, next := range paths[to] {
		var err error
		if from == proxy.StateChecking && next == proxy.StateAvailable {
			err = f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: from, To: next, CheckedAt: checkedAt, Success: true, Latency: 20 * time.Millisecond})
		} else {
			err = f.p.Transition(f.ctx, id, from, next, f.now)
		}
		if err != nil {
			f.t.Fatalf("drive %s %s -> %s: %v", id, from, next, err)
		}
		from = next
	}
}

// put admits ps under up and drives them to state.
func (f *fixture) put(up string, state proxy.State, ps ...proxy.Proxy) []proxy.ID {
	f.t.Helper()
	ids := f.admit(up, ps...)
	for _, id := range ids {
		f.drive(id, state, f.now)
	}
	return ids
}

func (f *fixture) get(id proxy.ID) proxy.Proxy {
	f.t.Helper()
	p, err := f.p.Get(f.ctx, id)
	if err != nil {
		f.t.Fatalf("get %s: %v", id, err)
	}
	return p
}

func (f *fixture) wantState(id proxy.ID, want proxy.State) {
	f.t.Helper()
	if got := f.get(id).State; got != want {
		f.t.Errorf("proxy %s: state %s, want %s", id, got, want)
	}
}

func (f *fixture) counts() map[proxy.State]int {
	f.t.Helper()
	c, err := f.p.Counts(f.ctx)
	if err != nil {
		f.t.Fatalf("counts: %v", err)
	}
	return c
}

func (f *fixture) extract(req extraction.Request) extraction.Result {
	f.t.Helper()
	if req.Now.IsZero() {
		req.Now = f.now
	}
	if req.Fulfillment == "" {
		req.Fulfillment = extraction.Partial
	}
	res, err := f.p.Extract(f.ctx, req)
	if err != nil {
		f.t.Fatalf("extract %+v: %v", req, err)
	}
	return res
}

func ids(ps []proxy.Proxy) []proxy.ID {
	out := make([]proxy.ID, len(ps))
	for i := range ps {
		out[i] = ps[i].ID
	}
	return out
}

func sorted(xs []proxy.ID) []proxy.ID {
	out := slices.Clone(xs)
	slices.Sort(out)
	return out
}

func sameSet(a, b []proxy.ID) bool { return slices.Equal(sorted(a), sorted(b)) }

func testAdmit(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	t.Run("NewProxiesAreFetched", func(t *testing.T) {
		f := newFixture(t, newPool)
		ps := []proxy.Proxy{f.px("a1"), f.px("a2"), f.px("a3")}
		res, err := f.p.Admit(f.ctx, "a", ps, 10)
		if err != nil {
			t.Fatal(err)
		}
		if res.Duplicates != 0 || res.Full != 0 || !slices.Equal(res.Added, []proxy.ID{idOf(ps[0]), idOf(ps[1]), idOf(ps[2])}) {
			t.Fatalf("admit result %+v", res)
		}
		for _, p := range ps {
			got := f.get(idOf(p))
			if got.State != proxy.StateFetched || got.Upstream != "a" || got.Owner != "" || got.ID != idOf(p) {
				t.Errorf("admitted %+v", got)
			}
			if !got.ExpiresAt.Equal(p.ExpiresAt) || !got.UsableUntil.Equal(p.UsableUntil) || got.Password != p.Password || got.MaxConcurrency != 4 || got.Region != "eu" || got.Carrier != "c1" || got.Tags["name"] != p.Tags["name"] {
				t.Errorf("admitted fields %+v, want from %+v", got, p)
			}
		}
	})
	t.Run("IDDerivedFromKey", func(t *testing.T) {
		f := newFixture(t, newPool)
		good := f.px("good")
		bad := f.px("bad", func(p *proxy.Proxy) { p.ID = "not-the-key" })
		if _, err := f.p.Admit(f.ctx, "a", []proxy.Proxy{good, bad}, 0); err == nil {
			t.Fatal("admit with a mismatching ID succeeded")
		}
		if _, err := f.p.Get(f.ctx, idOf(good)); !errors.Is(err, activitypool.ErrNotFound) {
			t.Errorf("refused batch admitted its valid element: %v", err)
		}
		good.ID = idOf(good)
		f.admit("a", good)
	})
	t.Run("DuplicateKeepsFirstOwnerAndTTL", func(t *testing.T) {
		f := newFixture(t, newPool)
		first := f.px("p")
		id := f.admit("a", first)[0]
		again := f.px("p", func(p *proxy.Proxy) {
			p.ExpiresAt = f.now.Add(3 * time.Hour)
			p.UsableUntil = f.now.Add(2 * time.Hour)
			p.Region = "us"
		})
		for _, up := range []string{"b", "a"} {
			res, err := f.p.Admit(f.ctx, up, []proxy.Proxy{again}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Added) != 0 || res.Duplicates != 1 {
				t.Errorf("re-admit from %s: %+v, want one duplicate", up, res)
			}
		}
		got := f.get(id)
		if got.Upstream != "a" || !got.ExpiresAt.Equal(first.ExpiresAt) || !got.UsableUntil.Equal(first.UsableUntil) || got.Region != "eu" {
			t.Errorf("duplicate overwrote the first lifecycle: %+v", got)
		}
		// Within one batch too.
		res, err := f.p.Admit(f.ctx, "b", []proxy.Proxy{f.px("q"), f.px("q")}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Added) != 1 || res.Duplicates != 1 {
			t.Errorf("same key twice in a batch: %+v", res)
		}
		// A live lifecycle keeps its key in every live state, EXTRACTED
		// included until hard expiry.
		for _, s := range []proxy.State{proxy.StateChecking, proxy.StateAvailable, proxy.StateSuspect, proxy.StateUnhealthy, proxy.StateDraining, proxy.StateExtracted} {
			p := f.px("live-" + s.String())
			f.put("a", s, p)
			res, err := f.p.Admit(f.ctx, "b", []proxy.Proxy{p}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Duplicates != 1 || len(res.Added) != 0 {
				t.Errorf("re-admit of a %s proxy: %+v, want duplicate", s, res)
			}
		}
	})
	t.Run("ReadmitAfterLifecycleEnds", func(t *testing.T) {
		hardExpired := func(p *proxy.Proxy) {
			p.ExpiresAt = time.Now().Add(-time.Minute)
			p.UsableUntil = p.ExpiresAt.Add(-time.Minute)
		}
		cases := []struct {
			name  string
			state proxy.State
			mod   func(*proxy.Proxy)
			// remove deletes the entry after driving it.
			remove bool
		}{
			{name: "Expired", state: proxy.StateExpired},
			{name: "RemovedState", state: proxy.StateRemoved},
			{name: "RemovedAndDeleted", state: proxy.StateUnhealthy, remove: true},
			{name: "ExtractedPastHardExpiry", state: proxy.StateExtracted, mod: hardExpired},
			{name: "FetchedPastHardExpiry", state: proxy.StateFetched, mod: hardExpired},
			{name: "AvailablePastHardExpiry", state: proxy.StateAvailable, mod: hardExpired},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f := newFixture(t, newPool)
				old := f.px("p")
				if tc.mod != nil {
					tc.mod(&old)
				}
				id := f.put("a", tc.state, old)[0]
				if tc.remove {
					if err := f.p.Remove(f.ctx, id); err != nil {
						t.Fatal(err)
					}
				}
				fresh := f.px("p", func(p *proxy.Proxy) { p.ExpiresAt = f.now.Add(2 * time.Hour) })
				res, err := f.p.Admit(f.ctx, "b", []proxy.Proxy{fresh}, 0)
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Added) != 1 || res.Duplicates != 0 {
					t.Fatalf("re-admit after %s: %+v, want added", tc.name, res)
				}
				got := f.get(id)
				if got.Upstream != "b" || got.State != proxy.StateFetched || !got.ExpiresAt.Equal(fresh.ExpiresAt) || !got.ExtractedAt.IsZero() {
					t.Errorf("new lifecycle %+v", got)
				}
				c := f.counts()
				if c[proxy.StateFetched] != 1 || c[tc.state] != 0 && tc.state != proxy.StateFetched {
					t.Errorf("counts after re-admission %v", c)
				}
			})
		}
	})
	t.Run("MaxSizeBoundsManaged", func(t *testing.T) {
		f := newFixture(t, newPool)
		batch := []proxy.Proxy{f.px("m1"), f.px("m2"), f.px("m3"), f.px("m4"), f.px("m5")}
		res, err := f.p.Admit(f.ctx, "a", batch, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Added) != 3 || res.Full != 2 || res.Duplicates != 0 {
			t.Fatalf("admit 5 with maxSize 3: %+v", res)
		}
		// A duplicate of a full upstream is a duplicate, not a refusal.
		res, err = f.p.Admit(f.ctx, "a", []proxy.Proxy{batch[0]}, 3)
		if err != nil || res.Duplicates != 1 || res.Full != 0 {
			t.Fatalf("duplicate at maxSize: %+v, %v", res, err)
		}
		// Another upstream has its own bound.
		if res, err := f.p.Admit(f.ctx, "b", []proxy.Proxy{f.px("b1")}, 1); err != nil || len(res.Added) != 1 {
			t.Fatalf("other upstream: %+v, %v", res, err)
		}
		// Live states other than AVAILABLE still count.
		f.drive(idOf(batch[0]), proxy.StateUnhealthy, f.now)
		if res, _ := f.p.Admit(f.ctx, "a", []proxy.Proxy{f.px("m6")}, 3); res.Full != 1 {
			t.Errorf("UNHEALTHY stopped counting as managed: %+v", res)
		}
		// EXTRACTED and EXPIRED leave the managed set.
		f.drive(idOf(batch[1]), proxy.StateExtracted, f.now)
		f.drive(idOf(batch[2]), proxy.StateExpired, f.now)
		res, err = f.p.Admit(f.ctx, "a", []proxy.Proxy{f.px("m6"), f.px("m7"), f.px("m8")}, 3)
		if err != nil || len(res.Added) != 2 || res.Full != 1 {
			t.Errorf("after two left the managed set: %+v, %v", res, err)
		}
	})
	t.Run("CopiesInput", func(t *testing.T) {
		f := newFixture(t, newPool)
		p := f.px("c")
		id := f.admit("a", p)[0]
		p.Tags["name"] = "mutated"
		p.Tags["extra"] = "x"
		got := f.get(id)
		if got.Tags["name"] != "c" || len(got.Tags) != 1 {
			t.Errorf("store aliases the caller's tags: %v", got.Tags)
		}
	})
}

func testGet(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	f := newFixture(t, newPool)
	if _, err := f.p.Get(f.ctx, "http://nobody.example:1"); !errors.Is(err, activitypool.ErrNotFound) {
		t.Errorf("get unknown: %v, want ErrNotFound", err)
	}
	id := f.admit("a", f.px("g"))[0]
	got := f.get(id)
	got.Tags["name"] = "mutated"
	got.State = proxy.StateRemoved
	again := f.get(id)
	if again.Tags["name"] != "g" || again.State != proxy.StateFetched {
		t.Errorf("get returned an alias of stored state: %+v", again)
	}
}

func testTransition(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	t.Run("EveryEdge", func(t *testing.T) {
		f := newFixture(t, newPool)
		for _, from := range proxy.States() {
			for _, to := range proxy.States() {
				t.Run(from.String()+"->"+to.String(), func(t *testing.T) {
					f := f.with(t)
					id := f.put("a", from, f.px(fmt.Sprintf("e-%d-%d", from, to)))[0]
					err := f.p.Transition(f.ctx, id, from, to, f.now)
					if proxy.Transition(from, to) == nil {
						if err != nil {
							t.Fatalf("allowed edge refused: %v", err)
						}
						f.wantState(id, to)
						return
					}
					var te *proxy.TransitionError
					if !errors.As(err, &te) || te.From != from || te.To != to {
						t.Fatalf("illegal edge: %v, want *proxy.TransitionError{%s, %s}", err, from, to)
					}
					f.wantState(id, from)
				})
			}
		}
	})
	t.Run("CompareAndSet", func(t *testing.T) {
		f := newFixture(t, newPool)
		id := f.put("a", proxy.StateChecking, f.px("cas"))[0]
		err := f.p.Transition(f.ctx, id, proxy.StateFetched, proxy.StateChecking, f.now)
		if !errors.Is(err, activitypool.ErrConflict) {
			t.Errorf("stale from: %v, want ErrConflict", err)
		}
		err = f.p.Transition(f.ctx, id, proxy.StateSuspect, proxy.StateAvailable, f.now)
		if !errors.Is(err, activitypool.ErrConflict) {
			t.Errorf("stale from: %v, want ErrConflict", err)
		}
		f.wantState(id, proxy.StateChecking)
	})
	t.Run("UnknownID", func(t *testing.T) {
		f := newFixture(t, newPool)
		err := f.p.Transition(f.ctx, "http://nobody.example:1", proxy.StateFetched, proxy.StateChecking, f.now)
		if !errors.Is(err, activitypool.ErrNotFound) {
			t.Errorf("unknown id: %v, want ErrNotFound", err)
		}
	})
	t.Run("ConcurrentSingleWinner", func(t *testing.T) {
		f := newFixture(t, newPool)
		id := f.put("a", proxy.StateAvailable, f.px("race"))[0]
		const n = 32
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				to := proxy.StateDraining
				if i%2 == 1 {
					to = proxy.StateSuspect
				}
				errs[i] = f.p.Transition(f.ctx, id, proxy.StateAvailable, to, f.now)
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, activitypool.ErrConflict):
				t.Errorf("loser error %v, want ErrConflict", err)
			}
		}
		if won != 1 {
			t.Errorf("%d transitions out of AVAILABLE won, want exactly 1", won)
		}
	})
}

func testRecordHealth(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	f := newFixture(t, newPool)
	id := f.put("a", proxy.StateChecking, f.px("h"))[0]
	t1 := f.now.Add(time.Second)
	if err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: t1, Success: true, Latency: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	got := f.get(id)
	if got.State != proxy.StateAvailable || !got.LastCheckedAt.Equal(t1) || !got.LastSuccessAt.Equal(t1) || got.Latency != 30*time.Millisecond || got.ConsecutiveFails != 0 {
		t.Fatalf("after success %+v", got)
	}
	t2 := f.now.Add(2 * time.Second)
	if err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: proxy.StateAvailable, To: proxy.StateSuspect, CheckedAt: t2, Latency: 5 * time.Second, Fails: 1}); err != nil {
		t.Fatal(err)
	}
	got = f.get(id)
	if got.State != proxy.StateSuspect || !got.LastCheckedAt.Equal(t2) || !got.LastSuccessAt.Equal(t1) || got.Latency != 30*time.Millisecond || got.ConsecutiveFails != 1 {
		t.Fatalf("after failure %+v", got)
	}
	t3 := f.now.Add(3 * time.Second)
	if err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: proxy.StateSuspect, To: proxy.StateSuspect, CheckedAt: t3, Fails: 2}); err != nil {
		t.Fatalf("observation without a move: %v", err)
	}
	got = f.get(id)
	if got.State != proxy.StateSuspect || !got.LastCheckedAt.Equal(t3) || got.ConsecutiveFails != 2 {
		t.Fatalf("after second failure %+v", got)
	}

	t.Run("Conflict", func(t *testing.T) {
		f := f.with(t)
		err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: proxy.StateAvailable, To: proxy.StateSuspect, CheckedAt: f.now.Add(time.Hour), Fails: 9})
		if !errors.Is(err, activitypool.ErrConflict) {
			t.Fatalf("stale From: %v, want ErrConflict", err)
		}
		if got := f.get(id); !got.LastCheckedAt.Equal(t3) || got.ConsecutiveFails != 2 {
			t.Errorf("refused record changed the proxy: %+v", got)
		}
	})
	t.Run("IllegalEdge", func(t *testing.T) {
		var te *proxy.TransitionError
		err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: proxy.StateSuspect, To: proxy.StateExtracted, CheckedAt: t3})
		if !errors.As(err, &te) {
			t.Fatalf("illegal edge: %v, want *proxy.TransitionError", err)
		}
	})
	t.Run("UnknownID", func(t *testing.T) {
		err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: "http://nobody.example:1", From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: t3, Success: true})
		if !errors.Is(err, activitypool.ErrNotFound) {
			t.Fatalf("unknown id: %v, want ErrNotFound", err)
		}
	})
	t.Run("ToUnhealthy", func(t *testing.T) {
		err := f.p.RecordHealth(f.ctx, activitypool.Health{ID: id, From: proxy.StateSuspect, To: proxy.StateUnhealthy, CheckedAt: t3.Add(time.Second), Fails: 3})
		if err != nil {
			t.Fatal(err)
		}
		f.with(t).wantState(id, proxy.StateUnhealthy)
	})
}

func testRemove(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	for _, s := range proxy.States() {
		t.Run(s.String(), func(t *testing.T) {
			f := newFixture(t, newPool)
			id := f.put("a", s, f.px("r"))[0]
			err := f.p.Remove(f.ctx, id)
			switch s {
			case proxy.StateExpired, proxy.StateUnhealthy, proxy.StateRemoved:
				if err != nil {
					t.Fatalf("remove from %s: %v", s, err)
				}
				if _, err := f.p.Get(f.ctx, id); !errors.Is(err, activitypool.ErrNotFound) {
					t.Errorf("removed proxy still readable: %v", err)
				}
				if c := f.counts(); c[s] != 0 {
					t.Errorf("counts after remove %v", c)
				}
			default:
				var te *proxy.TransitionError
				if !errors.As(err, &te) {
					t.Fatalf("remove from %s: %v, want *proxy.TransitionError", s, err)
				}
				f.wantState(id, s)
			}
		})
	}
	t.Run("UnknownID", func(t *testing.T) {
		f := newFixture(t, newPool)
		if err := f.p.Remove(f.ctx, "http://nobody.example:1"); !errors.Is(err, activitypool.ErrNotFound) {
			t.Errorf("unknown id: %v, want ErrNotFound", err)
		}
	})
}

func testSetOwner(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	f := newFixture(t, newPool)
	av := f.put("a", proxy.StateAvailable, f.px("o1"), f.px("o2"))
	dr := f.put("a", proxy.StateDraining, f.px("o3"))[0]
	owner := func(id proxy.ID) string {
		p, err := f.p.Get(f.ctx, id)
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return p.Owner
	}

	if err := f.p.SetOwner(f.ctx, av[:1], "w1"); err != nil {
		t.Fatal(err)
	}
	if owner(av[0]) != "w1" {
		t.Fatalf("owner %q", owner(av[0]))
	}
	if err := f.p.SetOwner(f.ctx, av[:1], "w1"); err != nil {
		t.Errorf("same owner again: %v", err)
	}
	t.Run("OtherOwnerConflicts", func(t *testing.T) {
		err := f.p.SetOwner(f.ctx, []proxy.ID{av[1], av[0]}, "w2")
		if !errors.Is(err, activitypool.ErrConflict) {
			t.Fatalf("steal ownership: %v, want ErrConflict", err)
		}
		if owner(av[0]) != "w1" || owner(av[1]) != "" {
			t.Errorf("refused batch changed owners: %q %q", owner(av[0]), owner(av[1]))
		}
	})
	t.Run("NotAvailableConflicts", func(t *testing.T) {
		err := f.p.SetOwner(f.ctx, []proxy.ID{av[1], dr}, "w2")
		if !errors.Is(err, activitypool.ErrConflict) {
			t.Fatalf("assign DRAINING: %v, want ErrConflict", err)
		}
		if owner(av[1]) != "" {
			t.Errorf("refused batch assigned %s", av[1])
		}
	})
	t.Run("UnknownID", func(t *testing.T) {
		err := f.p.SetOwner(f.ctx, []proxy.ID{av[1], "http://nobody.example:1"}, "w2")
		if !errors.Is(err, activitypool.ErrNotFound) {
			t.Fatalf("unknown id: %v, want ErrNotFound", err)
		}
		if owner(av[1]) != "" {
			t.Errorf("refused batch assigned %s", av[1])
		}
	})
	t.Run("ClearInAnyState", func(t *testing.T) {
		if err := f.p.Transition(f.ctx, av[0], proxy.StateAvailable, proxy.StateDraining, f.now); err != nil {
			t.Fatal(err)
		}
		if err := f.p.SetOwner(f.ctx, []proxy.ID{av[0], dr}, ""); err != nil {
			t.Fatalf("clear: %v", err)
		}
		if owner(av[0]) != "" {
			t.Errorf("owner not cleared")
		}
	})
	t.Run("OwnedNotExtracted", func(t *testing.T) {
		g := newFixture(t, newPool)
		ps := g.put("a", proxy.StateAvailable, g.px("x1"), g.px("x2"))
		if err := g.p.SetOwner(g.ctx, ps[:1], "w1"); err != nil {
			t.Fatal(err)
		}
		res := g.extract(extraction.Request{Client: "c", Count: 2})
		if !slices.Equal(ids(res.Proxies), ps[1:]) {
			t.Fatalf("extracted %v, want only the unowned %v", ids(res.Proxies), ps[1:])
		}
		// Cleared ownership makes it extractable again.
		if err := g.p.SetOwner(g.ctx, ps[:1], ""); err != nil {
			t.Fatal(err)
		}
		if res := g.extract(extraction.Request{Client: "c", Count: 2}); !slices.Equal(ids(res.Proxies), ps[:1]) {
			t.Fatalf("after clear extracted %v, want %v", ids(res.Proxies), ps[:1])
		}
	})
}

func testList(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	f := newFixture(t, newPool)
	aAvail := f.put("a", proxy.StateAvailable, f.px("l1"), f.px("l2"))
	aFetched := f.put("a", proxy.StateFetched, f.px("l3"))
	bAvail := f.put("b", proxy.StateAvailable, f.px("l4"))
	bSusp := f.put("b", proxy.StateSuspect, f.px("l5"))
	all := slices.Concat(aAvail, aFetched, bAvail, bSusp)
	cases := []struct {
		name string
		f    activitypool.Filter
		want []proxy.ID
	}{
		{"All", activitypool.Filter{}, all},
		{"Upstream", activitypool.Filter{Upstream: "a"}, slices.Concat(aAvail, aFetched)},
		{"UnknownUpstream", activitypool.Filter{Upstream: "zz"}, nil},
		{"State", activitypool.Filter{States: []proxy.State{proxy.StateAvailable}}, slices.Concat(aAvail, bAvail)},
		{"States", activitypool.Filter{States: []proxy.State{proxy.StateFetched, proxy.StateSuspect}}, slices.Concat(aFetched, bSusp)},
		{"UpstreamAndState", activitypool.Filter{Upstream: "b", States: []proxy.State{proxy.StateAvailable}}, bAvail},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.p.List(f.ctx, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if !sameSet(ids(got), tc.want) {
				t.Errorf("list %+v = %v, want %v", tc.f, sorted(ids(got)), sorted(tc.want))
			}
		})
	}
	t.Run("Limit", func(t *testing.T) {
		got, err := f.p.List(f.ctx, activitypool.Filter{Upstream: "a", Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("limit 2 returned %d", len(got))
		}
		for _, p := range got {
			if !slices.Contains(slices.Concat(aAvail, aFetched), p.ID) {
				t.Errorf("limited list returned %s from another upstream", p.ID)
			}
		}
	})
	t.Run("Copies", func(t *testing.T) {
		f := f.with(t)
		got, err := f.p.List(f.ctx, activitypool.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			got[i].Tags["name"] = "mutated"
		}
		if f.get(all[0]).Tags["name"] == "mutated" {
			t.Error("list aliases stored tags")
		}
	})
}

func testCounts(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	f := newFixture(t, newPool)
	want := map[proxy.State]int{}
	for i, s := range proxy.States() {
		for j := range i%3 + 1 {
			up := "a"
			if j%2 == 1 {
				up = "b"
			}
			f.put(up, s, f.px(fmt.Sprintf("c-%d-%d", s, j)))
			want[s]++
		}
	}
	got := f.counts()
	for _, s := range proxy.States() {
		if got[s] != want[s] {
			t.Errorf("count %s = %d, want %d", s, got[s], want[s])
		}
	}
}

func testInventory(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	f := newFixture(t, newPool)
	slots := func(n int64) func(*proxy.Proxy) { return func(p *proxy.Proxy) { p.MaxConcurrency = n } }
	f.put("a", proxy.StateFetched, f.px("i1"), f.px("i2"))
	f.put("a", proxy.StateChecking, f.px("i3"))
	usable := f.put("a", proxy.StateAvailable, f.px("i4", slots(4)), f.px("i5", slots(5)), f.px("i6", slots(6)))
	if err := f.p.SetOwner(f.ctx, usable[:1], "w1"); err != nil {
		t.Fatal(err)
	}
	// Past its usable period but not hard-expired: still managed, not usable.
	f.put("a", proxy.StateAvailable, f.px("i7", slots(100), func(p *proxy.Proxy) { p.UsableUntil = f.now.Add(-time.Second) }))
	f.put("a", proxy.StateSuspect, f.px("i8"))
	f.put("a", proxy.StateDraining, f.px("i9"))
	f.put("a", proxy.StateUnhealthy, f.px("i10"))
	f.put("a", proxy.StateExtracted, f.px("i11"))
	f.put("a", proxy.StateExpired, f.px("i12"))
	f.put("a", proxy.StateRemoved, f.px("i13"))
	f.put("b", proxy.StateAvailable, f.px("i14", slots(50)))

	inv, err := f.p.Inventory(f.ctx, "a", f.now)
	if err != nil {
		t.Fatal(err)
	}
	// Managed: 2 FETCHED + CHECKING + 4 AVAILABLE + SUSPECT + DRAINING + UNHEALTHY.
	if inv.Managed != 10 || inv.Available != 3 || inv.AvailableSlots != 15 || inv.Pending != 3 {
		t.Errorf("inventory of a = %+v, want Managed 10 Available 3 AvailableSlots 15 Pending 3", inv)
	}
	// Later, the usable ones pass their UsableUntil too.
	inv, err = f.p.Inventory(f.ctx, "a", f.now.Add(56*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if inv.Available != 0 || inv.AvailableSlots != 0 || inv.Managed != 10 {
		t.Errorf("inventory after usable period = %+v", inv)
	}
	inv, err = f.p.Inventory(f.ctx, "nobody", f.now)
	if err != nil || inv != (upstream.Inventory{}) {
		t.Errorf("inventory of unknown upstream = %+v, %v", inv, err)
	}
}

func testExtract(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	t.Run("MovesToExtracted", func(t *testing.T) {
		f := newFixture(t, newPool)
		all := f.put("a", proxy.StateAvailable, f.px("x1"), f.px("x2"), f.px("x3"), f.px("x4"), f.px("x5"))
		at := f.now.Add(time.Second)
		res := f.extract(extraction.Request{Client: "c1", Count: 3, Now: at})
		if res.Requested != 3 || res.Returned != 3 || len(res.Proxies) != 3 || res.Replayed {
			t.Fatalf("result %+v", res)
		}
		for _, p := range res.Proxies {
			if !slices.Contains(all, p.ID) {
				t.Errorf("extracted unknown %s", p.ID)
			}
			if p.State != proxy.StateExtracted || p.ExtractedByClient != "c1" || !p.ExtractedAt.Equal(at) || p.Password == "" || p.Upstream != "a" {
				t.Errorf("extracted proxy %+v", p)
			}
			stored := f.get(p.ID)
			if stored.State != proxy.StateExtracted || stored.ExtractedByClient != "c1" || !stored.ExtractedAt.Equal(at) {
				t.Errorf("stored after extraction %+v", stored)
			}
		}
		c := f.counts()
		if c[proxy.StateExtracted] != 3 || c[proxy.StateAvailable] != 2 {
			t.Errorf("counts %v", c)
		}
		// Extracted proxies never come back.
		res = f.extract(extraction.Request{Client: "c2", Count: 5})
		if res.Returned != 2 {
			t.Errorf("second extraction returned %d, want the 2 left", res.Returned)
		}
		if inv, _ := f.p.Inventory(f.ctx, "a", f.now); inv.Managed != 0 || inv.Available != 0 {
			t.Errorf("inventory after extracting all %+v", inv)
		}
	})
	t.Run("MostRemainingTimeFirst", func(t *testing.T) {
		f := newFixture(t, newPool)
		usable := func(d time.Duration) func(*proxy.Proxy) {
			return func(p *proxy.Proxy) { p.UsableUntil = f.now.Add(d); p.ExpiresAt = f.now.Add(d + 5*time.Minute) }
		}
		ps := f.put("a", proxy.StateAvailable, f.px("t10", usable(10*time.Minute)), f.px("t50", usable(50*time.Minute)), f.px("t30", usable(30*time.Minute)))
		ps = append(ps, f.put("b", proxy.StateAvailable, f.px("t40", usable(40*time.Minute)))...)
		want := []proxy.ID{ps[1], ps[3], ps[2], ps[0]}
		for i, w := range want {
			if got := f.extract(extraction.Request{Client: "c", Count: 1}); got.Returned != 1 || got.Proxies[0].ID != w {
				t.Fatalf("extraction %d returned %v, want %s", i, ids(got.Proxies), w)
			}
		}
		f2 := newFixture(t, newPool)
		ps = f2.put("a", proxy.StateAvailable, f2.px("t10", usable(10*time.Minute)), f2.px("t50", usable(50*time.Minute)), f2.px("t30", usable(30*time.Minute)))
		ps = append(ps, f2.put("b", proxy.StateAvailable, f2.px("t40", usable(40*time.Minute)))...)
		got := f2.extract(extraction.Request{Client: "c", Count: 2, Filters: extraction.Filters{Upstreams: []string{"a", "b"}}})
		if !slices.Equal(ids(got.Proxies), []proxy.ID{ps[1], ps[3]}) {
			t.Errorf("across upstreams returned %v, want %v", ids(got.Proxies), []proxy.ID{ps[1], ps[3]})
		}
	})
	t.Run("InvalidRequestChangesNothing", func(t *testing.T) {
		f := newFixture(t, newPool)
		f.put("a", proxy.StateAvailable, f.px("v1"))
		for _, req := range []extraction.Request{
			{Count: 0, Fulfillment: extraction.Partial},
			{Count: extraction.MaxCount + 1, Fulfillment: extraction.Partial},
			{Count: 1, Fulfillment: "some"},
			{Count: 1, Fulfillment: extraction.Partial, Filters: extraction.Filters{Protocol: "ftp"}},
		} {
			req.Now = f.now
			if _, err := f.p.Extract(f.ctx, req); err == nil {
				t.Errorf("extract %+v succeeded", req)
			}
		}
		if c := f.counts(); c[proxy.StateAvailable] != 1 {
			t.Errorf("invalid requests changed the pool: %v", c)
		}
	})
}

func testExtractFilters(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	// One pool per case, each proxy differing from "base" in one way.
	type spec struct {
		name, upstream string
		mod            func(f *fixture, p *proxy.Proxy)
		checkedAgo     time.Duration
		owner          string
	}
	specs := []spec{
		{name: "base", upstream: "a"},
		{name: "https", upstream: "a", mod: func(_ *fixture, p *proxy.Proxy) { p.Key.Scheme = proxy.SchemeHTTPS }},
		{name: "us", upstream: "a", mod: func(_ *fixture, p *proxy.Proxy) { p.Region = "us" }},
		{name: "c2", upstream: "a", mod: func(_ *fixture, p *proxy.Proxy) { p.Carrier = "c2" }},
		{name: "b", upstream: "b"},
		{name: "short", upstream: "a", mod: func(f *fixture, p *proxy.Proxy) {
			p.ExpiresAt = f.now.Add(2 * time.Minute)
			p.UsableUntil = f.now.Add(time.Minute)
		}},
		{name: "stale", upstream: "a", checkedAgo: 2 * time.Hour},
		{name: "owned", upstream: "a", owner: "w1"},
		{name: "unusable", upstream: "a", mod: func(f *fixture, p *proxy.Proxy) { p.UsableUntil = f.now.Add(-time.Second) }},
	}
	eligible := []string{"base", "https", "us", "c2", "b", "short", "stale"}
	without := func(names ...string) []string {
		return slices.DeleteFunc(slices.Clone(eligible), func(n string) bool { return slices.Contains(names, n) })
	}
	cases := []struct {
		name    string
		filters extraction.Filters
		want    []string
	}{
		{"None", extraction.Filters{}, eligible},
		{"ProtocolHTTPS", extraction.Filters{Protocol: proxy.SchemeHTTPS}, []string{"https"}},
		{"ProtocolHTTP", extraction.Filters{Protocol: proxy.SchemeHTTP}, without("https")},
		{"Region", extraction.Filters{Region: "us"}, []string{"us"}},
		{"Carrier", extraction.Filters{Carrier: "c2"}, []string{"c2"}},
		{"UpstreamB", extraction.Filters{Upstreams: []string{"b"}}, []string{"b"}},
		{"UpstreamA", extraction.Filters{Upstreams: []string{"a"}}, without("b")},
		{"UnknownUpstream", extraction.Filters{Upstreams: []string{"zz"}}, nil},
		{"MinRemainingTTL", extraction.Filters{MinRemainingTTL: 30 * time.Minute}, without("short")},
		{"MaxHealthCheckAge", extraction.Filters{MaxHealthCheckAge: time.Hour}, without("stale")},
		{"All", extraction.Filters{Protocol: proxy.SchemeHTTP, Region: "eu", Carrier: "c1", Upstreams: []string{"a"}, MinRemainingTTL: 30 * time.Minute, MaxHealthCheckAge: time.Hour}, []string{"base"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, newPool)
			byName := map[string]proxy.ID{}
			for _, s := range specs {
				p := f.px(s.name)
				if s.mod != nil {
					s.mod(f, &p)
				}
				id := f.admit(s.upstream, p)[0]
				f.drive(id, proxy.StateAvailable, f.now.Add(-s.checkedAgo))
				if s.owner != "" {
					if err := f.p.SetOwner(f.ctx, []proxy.ID{id}, s.owner); err != nil {
						t.Fatal(err)
					}
				}
				byName[s.name] = id
			}
			var want []proxy.ID
			for _, n := range tc.want {
				want = append(want, byName[n])
			}
			res := f.extract(extraction.Request{Client: "c", Count: 20, Filters: tc.filters})
			if !sameSet(ids(res.Proxies), want) || res.Returned != len(want) {
				t.Errorf("filters %+v returned %v, want %v", tc.filters, sorted(ids(res.Proxies)), sorted(want))
			}
			if c := f.counts(); c[proxy.StateExtracted] != len(want) || c[proxy.StateAvailable] != len(specs)-len(want) {
				t.Errorf("counts %v", c)
			}
		})
	}
}

func testReserve(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	setup := func(t *testing.T) (*fixture, []proxy.ID, []proxy.ID) {
		f := newFixture(t, newPool)
		a := f.put("a", proxy.StateAvailable, f.px("a1"), f.px("a2"), f.px("a3"), f.px("a4"), f.px("a5"))
		// An owned proxy is gateway capacity: it counts toward the reserve
		// but is never extracted.
		if err := f.p.SetOwner(f.ctx, a[:1], "w1"); err != nil {
			t.Fatal(err)
		}
		// An unusable AVAILABLE proxy counts for nothing.
		f.put("a", proxy.StateAvailable, f.px("a6", func(p *proxy.Proxy) { p.UsableUntil = f.now.Add(-time.Second) }))
		b := f.put("b", proxy.StateAvailable, f.px("b1"), f.px("b2"), f.px("b3"))
		return f, a, b
	}
	t.Run("WithinUpstreamFilter", func(t *testing.T) {
		f, _, b := setup(t)
		res := f.extract(extraction.Request{Client: "c", Count: 10, ReserveForGateway: 3, Filters: extraction.Filters{Upstreams: []string{"a"}}})
		if res.Returned != 2 {
			t.Fatalf("returned %d, want 2 (5 usable AVAILABLE - reserve 3)", res.Returned)
		}
		if res := f.extract(extraction.Request{Client: "c", Count: 10, ReserveForGateway: 3, Filters: extraction.Filters{Upstreams: []string{"a"}}}); res.Returned != 0 {
			t.Errorf("second extraction returned %d, want 0", res.Returned)
		}
		for _, id := range b {
			f.wantState(id, proxy.StateAvailable)
		}
	})
	t.Run("AllUpstreams", func(t *testing.T) {
		f, _, _ := setup(t)
		res := f.extract(extraction.Request{Client: "c", Count: 10, ReserveForGateway: 4})
		if res.Returned != 4 {
			t.Fatalf("returned %d, want 4 (8 usable AVAILABLE - reserve 4)", res.Returned)
		}
		if c := f.counts(); c[proxy.StateAvailable] != 5 {
			t.Errorf("counts %v", c)
		}
	})
	t.Run("AllOrNothing", func(t *testing.T) {
		f, _, _ := setup(t)
		_, err := f.p.Extract(f.ctx, extraction.Request{Client: "c", Count: 3, Fulfillment: extraction.AllOrNothing, ReserveForGateway: 3, Filters: extraction.Filters{Upstreams: []string{"a"}}, Now: f.now})
		var ie *extraction.InsufficientError
		if !errors.As(err, &ie) || ie.Requested != 3 || ie.Available != 2 {
			t.Fatalf("allOrNothing under reserve: %v, want InsufficientError{3, 2}", err)
		}
		if c := f.counts(); c[proxy.StateExtracted] != 0 {
			t.Errorf("refused extraction changed %d proxies", c[proxy.StateExtracted])
		}
	})
}

func testFulfillment(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	t.Run("PartialShort", func(t *testing.T) {
		f := newFixture(t, newPool)
		f.put("a", proxy.StateAvailable, f.px("p1"), f.px("p2"))
		res := f.extract(extraction.Request{Client: "c", Count: 5})
		if res.Requested != 5 || res.Returned != 2 || len(res.Proxies) != 2 {
			t.Errorf("partial short %+v", res)
		}
	})
	t.Run("PartialNothing", func(t *testing.T) {
		f := newFixture(t, newPool)
		f.put("a", proxy.StateChecking, f.px("p1"))
		res := f.extract(extraction.Request{Client: "c", Count: 5})
		if res.Requested != 5 || res.Returned != 0 || len(res.Proxies) != 0 {
			t.Errorf("partial with nothing eligible %+v", res)
		}
	})
	t.Run("AllOrNothingShortChangesNothing", func(t *testing.T) {
		f := newFixture(t, newPool)
		free := f.put("a", proxy.StateAvailable, f.px("n1"), f.px("n2"), f.px("n3"))
		owned := f.put("a", proxy.StateAvailable, f.px("n4"))
		if err := f.p.SetOwner(f.ctx, owned, "w1"); err != nil {
			t.Fatal(err)
		}
		_, err := f.p.Extract(f.ctx, extraction.Request{Client: "c", Count: 4, Fulfillment: extraction.AllOrNothing, Now: f.now})
		if !errors.Is(err, extraction.ErrInsufficient) {
			t.Fatalf("allOrNothing short: %v, want ErrInsufficient", err)
		}
		var ie *extraction.InsufficientError
		if !errors.As(err, &ie) || ie.Requested != 4 || ie.Available != 3 {
			t.Fatalf("allOrNothing short: %v, want InsufficientError{4, 3}", err)
		}
		for _, id := range slices.Concat(free, owned) {
			p := f.get(id)
			if p.State != proxy.StateAvailable || p.ExtractedByClient != "" || !p.ExtractedAt.IsZero() {
				t.Errorf("refused extraction touched %+v", p)
			}
		}
		if f.get(owned[0]).Owner != "w1" {
			t.Error("refused extraction changed ownership")
		}
		res, err := f.p.Extract(f.ctx, extraction.Request{Client: "c", Count: 3, Fulfillment: extraction.AllOrNothing, Now: f.now})
		if err != nil || res.Returned != 3 || !sameSet(ids(res.Proxies), free) {
			t.Errorf("allOrNothing exact: %+v, %v", res, err)
		}
	})
}

func testIdempotency(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	base := extraction.Request{
		Client:         "c1",
		Count:          2,
		Fulfillment:    extraction.Partial,
		IdempotencyKey: "key-1",
		IdempotencyTTL: time.Hour,
		Filters:        extraction.Filters{Region: "eu", Upstreams: []string{"a", "b"}},
	}
	t.Run("Replay", func(t *testing.T) {
		f := newFixture(t, newPool)
		f.put("a", proxy.StateAvailable, f.px("r1"), f.px("r2"), f.px("r3"), f.px("r4"))
		first := f.extract(base)
		if first.Replayed || first.Returned != 2 {
			t.Fatalf("first %+v", first)
		}
		again := base
		again.Filters.Upstreams = []string{"b", "a", "b"} // same set
		again.ReserveForGateway = 1                       // configuration, not the client's request
		for range 3 {
			second := f.extract(again)
			if !second.Replayed || second.Returned != 2 || second.Requested != 2 || !slices.Equal(ids(second.Proxies), ids(first.Proxies)) {
				t.Fatalf("retry %+v, want replay of %v", second, ids(first.Proxies))
			}
			if second.Proxies[0].Password == "" {
				t.Error("replay lost the credentials")
			}
		}
		if c := f.counts(); c[proxy.StateExtracted] != 2 {
			t.Errorf("retries extracted more: %v", c)
		}
		other := base
		other.IdempotencyKey = "key-2"
		if res := f.extract(other); res.Replayed || res.Returned != 2 || !sameSet(slices.Concat(ids(res.Proxies), ids(first.Proxies)), f.allIDs()) {
			t.Errorf("another key %+v", res)
		}
	})
	t.Run("Conflict", func(t *testing.T) {
		mods := []struct {
			name string
			mod  func(r *extraction.Request)
		}{
			{"Count", func(r *extraction.Request) { r.Count = 3 }},
			{"Client", func(r *extraction.Request) { r.Client = "c2" }},
			{"Fulfillment", func(r *extraction.Request) { r.Fulfillment = extraction.AllOrNothing }},
			{"Region", func(r *extraction.Request) { r.Filters.Region = "us" }},
			{"Protocol", func(r *extraction.Request) { r.Filters.Protocol = proxy.SchemeHTTP }},
			{"Upstreams", func(r *extraction.Request) { r.Filters.Upstreams = []string{"a"} }},
			{"MinRemainingTTL", func(r *extraction.Request) { r.Filters.MinRemainingTTL = time.Minute }},
		}
		f := newFixture(t, newPool)
		f.put("a", proxy.StateAvailable, f.px("k1"), f.px("k2"), f.px("k3"), f.px("k4"))
		f.extract(base)
		for _, m := range mods {
			t.Run(m.name, func(t *testing.T) {
				req := base
				req.Now = f.now
				m.mod(&req)
				_, err := f.p.Extract(f.ctx, req)
				if !errors.Is(err, extraction.ErrIdempotencyConflict) {
					t.Fatalf("reused key with another %s: %v, want ErrIdempotencyConflict", m.name, err)
				}
			})
		}
		if c := f.counts(); c[proxy.StateExtracted] != 2 {
			t.Errorf("conflicting requests extracted: %v", c)
		}
	})
	t.Run("FailedAllOrNothingNotRecorded", func(t *testing.T) {
		f := newFixture(t, newPool)
		f.put("a", proxy.StateAvailable, f.px("f1"))
		req := base
		req.Fulfillment = extraction.AllOrNothing
		req.Now = f.now
		if _, err := f.p.Extract(f.ctx, req); !errors.Is(err, extraction.ErrInsufficient) {
			t.Fatalf("short allOrNothing: %v", err)
		}
		f.put("a", proxy.StateAvailable, f.px("f2"))
		res := f.extract(req)
		if res.Replayed || res.Returned != 2 {
			t.Errorf("retry after refill %+v, want a fresh extraction of 2", res)
		}
	})
	t.Run("Expiry", func(t *testing.T) {
		f := newFixture(t, newPool)
		f.put("a", proxy.StateAvailable, f.px("e1"), f.px("e2"), f.px("e3"), f.px("e4"))
		req := base
		req.IdempotencyTTL = 50 * time.Millisecond
		first := f.extract(req)
		// Poll: while the record lives every retry is a harmless replay.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		deadline := time.After(10 * time.Second)
		for {
			res := f.extract(req)
			if !res.Replayed {
				if res.Returned != 2 || !sameSet(slices.Concat(ids(first.Proxies), ids(res.Proxies)), f.allIDs()) {
					t.Errorf("after expiry %+v, want the other two proxies", res)
				}
				return
			}
			select {
			case <-tick.C:
			case <-deadline:
				t.Fatal("idempotency record never expired")
			}
		}
	})
}

func (f *fixture) allIDs() []proxy.ID {
	f.t.Helper()
	ps, err := f.p.List(f.ctx, activitypool.Filter{})
	if err != nil {
		f.t.Fatal(err)
	}
	return ids(ps)
}

func testConcurrentExtract(t *testing.T, newPool func(t *testing.T) activitypool.Pool) {
	const (
		proxies    = 2000
		goroutines = 64
	)
	f := newFixture(t, newPool)
	for u := range 4 {
		batch := make([]proxy.Proxy, 0, proxies/4)
		for i := range proxies / 4 {
			batch = append(batch, f.px(fmt.Sprintf("cc-%d-%d", u, i), func(p *proxy.Proxy) {
				// Spread the usable periods so the ordered walk is exercised.
				p.UsableUntil = f.now.Add(time.Duration(10+i%40) * time.Minute)
			}))
		}
		f.put(fmt.Sprintf("u%d", u), proxy.StateAvailable, batch...)
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		got     []proxy.ID
		failure = make(chan string, goroutines)
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []proxy.ID
			defer func() {
				mu.Lock()
				got = append(got, mine...)
				mu.Unlock()
			}()
			for round := 0; ; round++ {
				req := extraction.Request{Client: fmt.Sprintf("c%d", g), Count: 1 + (g+round)%7, Fulfillment: extraction.Partial, Now: f.now}
				switch round % 5 {
				case 1:
					req.Filters.Upstreams = []string{fmt.Sprintf("u%d", g%4)}
				case 3:
					req.Fulfillment = extraction.AllOrNothing
					req.Count = 40
				case 4:
					req.IdempotencyKey = fmt.Sprintf("g%d-r%d", g, round)
					req.IdempotencyTTL = time.Hour
				}
				res, err := f.p.Extract(f.ctx, req)
				if errors.Is(err, extraction.ErrInsufficient) {
					continue
				}
				if err != nil {
					failure <- fmt.Sprintf("goroutine %d round %d: %v", g, round, err)
					return
				}
				if req.IdempotencyKey != "" {
					again, err := f.p.Extract(f.ctx, req)
					if err != nil || !again.Replayed || !slices.Equal(ids(again.Proxies), ids(res.Proxies)) {
						failure <- fmt.Sprintf("goroutine %d round %d: replay %v, %v; want %v", g, round, ids(again.Proxies), err, ids(res.Proxies))
						return
					}
				}
				mine = append(mine, ids(res.Proxies)...)
				if res.Returned == 0 && req.Filters.Upstreams == nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(failure)
	for msg := range failure {
		t.Error(msg)
	}
	seen := make(map[proxy.ID]bool, len(got))
	for _, id := range got {
		if seen[id] {
			t.Errorf("proxy %s extracted twice", id)
		}
		seen[id] = true
	}
	c := f.counts()
	if len(got) != proxies || c[proxy.StateExtracted] != proxies || c[proxy.StateAvailable] != 0 {
		t.Errorf("returned %d, EXTRACTED %d, AVAILABLE %d; want %d, %d, 0", len(got), c[proxy.StateExtracted], c[proxy.StateAvailable], proxies, proxies)
	}
}
