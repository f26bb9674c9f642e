package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/adapters/storetest"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

var nsSeq atomic.Int64

// namespace gives every test its own keyspace on a shared server.
func namespace(t testing.TB) string {
	return fmt.Sprintf("t%d-%s", nsSeq.Add(1), t.Name())
}

func client(t testing.TB, srv *testenv.Redis) *redis.Client {
	t.Helper()
	rdb, err := redisstore.NewClient(config.Redis{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func newPool(t testing.TB, rdb redis.UniversalClient, o redisstore.Options) *redisstore.Pool {
	t.Helper()
	if o.Namespace == "" {
		o.Namespace = namespace(t)
	}
	p, err := redisstore.New(context.Background(), rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPoolContract(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	storetest.RunPoolContract(t, func(t *testing.T) activitypool.Pool {
		return newPool(t, rdb, redisstore.Options{})
	})
}

// TestExtractWalk pins what the extraction script adds to the contract:
// the rows it returns are the stored records, a filter rejecting most of
// the top of an index pages on by rank without losing the order, and
// several upstreams merge in index order.
func TestExtractWalk(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	// spaced gives the i-th proxy of name a UsableUntil i minutes after
	// the first, the given region, and every field set.
	spaced := func(name string, i int, region string) proxy.Proxy {
		x := px(fmt.Sprintf("%s-%d", name, i), now, time.Hour+time.Duration(i)*time.Minute)
		x.Region, x.Carrier, x.Key.CredentialVersion = region, "c"+region, "v2"
		x.Password = "p:w\n" + name // separators survive
		x.Tags = map[string]string{"n": fmt.Sprint(i)}
		return x
	}
	idsOf := func(ps []proxy.Proxy) []proxy.ID {
		var out []proxy.ID
		for _, x := range ps {
			out = append(out, x.ID)
		}
		return out
	}

	t.Run("RowsAreTheStoredRecords", func(t *testing.T) {
		p := newPool(t, rdb, redisstore.Options{})
		for i := range 6 {
			available(t, p, "a", spaced("row", i, []string{"eu", "us"}[i%2]))
		}
		for _, req := range []extraction.Request{
			{Client: "c1", Count: 2, Fulfillment: extraction.Partial, Now: now},                                                                   // one HMGET per row
			{Client: "c2", Count: 2, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "us"}},                        // checked, then the rest
			{Client: "c3", Count: 2, Fulfillment: extraction.Partial, Now: now, IdempotencyKey: "k", Filters: extraction.Filters{Carrier: "ceu"}}, // and recorded
		} {
			res, err := p.Extract(ctx, req)
			if err != nil || res.Returned != 2 {
				t.Fatalf("extract %+v: %+v, %v", req, res, err)
			}
			for _, x := range res.Proxies {
				stored, err := p.Get(ctx, x.ID)
				if err != nil || !reflect.DeepEqual(x, stored) {
					t.Fatalf("returned %+v\nstored   %+v, %v", x, stored, err)
				}
				if x.State != proxy.StateExtracted || x.ExtractedByClient != req.Client || x.Tags["n"] == "" || x.Carrier == "" {
					t.Fatalf("returned %+v", x)
				}
			}
			if req.IdempotencyKey != "" {
				again, err := p.Extract(ctx, req)
				if err != nil || !again.Replayed || !reflect.DeepEqual(again.Proxies, res.Proxies) {
					t.Fatalf("replay %+v, %v; want %+v", again, err, res.Proxies)
				}
			}
		}
	})

	t.Run("PagesPastRejectedCandidates", func(t *testing.T) {
		// 60 proxies over two upstreams, one in six in region zz: the
		// first page (Count members) holds at most two matches, so the
		// walk pages on.
		p := newPool(t, rdb, redisstore.Options{})
		var want, rest []proxy.ID
		for i := range 60 {
			region := "eu"
			if i%6 == 0 {
				region = "zz"
			}
			id := available(t, p, []string{"a", "b"}[(i/6)%2], spaced("pg", i, region))[0]
			if region == "zz" {
				want = append([]proxy.ID{id}, want...) // most usable first
			} else {
				rest = append([]proxy.ID{id}, rest...)
			}
		}
		res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 7, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "zz"}})
		if err != nil || !slices.Equal(idsOf(res.Proxies), want[:7]) {
			t.Fatalf("extracted %v, %v; want %v", idsOf(res.Proxies), err, want[:7])
		}
		// Merging both upstreams' indexes, past the last match the walk
		// ends at the indexes' last usable members, not before.
		res, err = p.Extract(ctx, extraction.Request{Client: "c", Count: 7, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "zz", Upstreams: []string{"a", "b"}}})
		if err != nil || !slices.Equal(idsOf(res.Proxies), want[7:]) {
			t.Fatalf("extracted %v, %v; want the last %v", idsOf(res.Proxies), err, want[7:])
		}
		// Every page of both is walked: all the rest, in order.
		res, err = p.Extract(ctx, extraction.Request{Client: "c", Count: 60, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "eu", Upstreams: []string{"a", "b"}}})
		if err != nil || !slices.Equal(idsOf(res.Proxies), rest) {
			t.Fatalf("extracted %v, %v; want %v", idsOf(res.Proxies), err, rest)
		}
	})

	t.Run("MergedPagesByRank", func(t *testing.T) {
		// One match per upstream, at every rank from 0 to 19 in turn: the
		// merged walk must page through both indexes without a gap.
		for rank := range 20 {
			p := newPool(t, rdb, redisstore.Options{})
			var want []proxy.ID
			for i := range 20 {
				for j, up := range []string{"a", "b"} {
					region := "eu"
					if 19-i == rank {
						region = "zz"
					}
					id := available(t, p, up, spaced("r"+up, 2*i+j, region))[0]
					if region == "zz" {
						want = append([]proxy.ID{id}, want...)
					}
				}
			}
			res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 2, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "zz", Upstreams: []string{"a", "b"}}})
			if err != nil || !slices.Equal(idsOf(res.Proxies), want) {
				t.Fatalf("matches at rank %d: extracted %v, %v; want %v", rank, idsOf(res.Proxies), err, want)
			}
		}
	})

	t.Run("MergesUpstreamsInIndexOrder", func(t *testing.T) {
		// Interleaved UsableUntil over three upstreams, a tie between a
		// and b (newest admission first), and a filter rejecting some.
		p := newPool(t, rdb, redisstore.Options{})
		type entry struct {
			up     string
			i      int
			region string
		}
		var admitted []proxy.ID
		for _, e := range []entry{{"a", 1, "eu"}, {"b", 2, "eu"}, {"a", 3, "zz"}, {"c", 4, "eu"}, {"b", 5, "eu"}, {"a", 6, "eu"}, {"b", 6, "eu"}, {"a", 7, "eu"}, {"b", 8, "zz"}} {
			admitted = append(admitted, available(t, p, e.up, spaced("m"+e.up, e.i, e.region))[0])
		}
		// Upstreams a and b, region eu: by UsableUntil descending a7, then
		// the tie b6 (admitted after a6), a6, b5, b2, a1; c is not asked.
		want := []proxy.ID{admitted[7], admitted[6], admitted[5], admitted[4], admitted[1]}
		res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 5, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "eu", Upstreams: []string{"b", "a"}}})
		if err != nil || !slices.Equal(idsOf(res.Proxies), want) {
			t.Fatalf("extracted %v, %v; want %v", idsOf(res.Proxies), err, want)
		}
	})
}

// TestInventorySlotPages reads AvailableSlots where the side of now it
// sums spans several pages of the AVAILABLE index, on either side.
func TestInventorySlotPages(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	p := newPool(t, rdb, redisstore.Options{})
	if err := redisstore.BulkLoadAvailable(ctx, p, "a", "inv", 4000); err != nil {
		t.Fatal(err)
	}
	ps, err := p.List(ctx, activitypool.Filter{Upstream: "a", States: []proxy.State{proxy.StateAvailable}})
	if err != nil || len(ps) != 4000 {
		t.Fatalf("list %d, %v", len(ps), err)
	}
	uu := make([]time.Time, len(ps))
	for i, x := range ps {
		uu[i] = x.UsableUntil
	}
	slices.SortFunc(uu, time.Time.Compare)
	for _, unusable := range []int{1400, 2600} { // usable > unusable, then <
		at := uu[unusable].Add(-time.Microsecond)
		var usable int
		var slots int64
		for _, x := range ps {
			if at.Before(x.UsableUntil) {
				usable++
				slots += x.MaxConcurrency
			}
		}
		inv, err := p.Inventory(ctx, "a", at)
		if err != nil || inv.Available != usable || inv.AvailableSlots != slots {
			t.Fatalf("inventory at %d unusable: %+v, %v; want %d available, %d slots", unusable, inv, err, usable, slots)
		}
	}
}

// TestExtractSkewedRegion: every call asks for region eu, one entry in ten,
// all of them among the most usable half of the index and four others
// above each. The calls walk the region's own free index, so the entries
// they reject never pile up ahead of them: with MaxExamined 50 every call
// returns its 10 until eu is exhausted, then reports exactly what is left.
// (Walking the upstream's index, the second call already had to step over
// the ~40 others the first one left on top, and the bound cut it short.)
func TestExtractSkewedRegion(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	now := time.Now().UTC()
	p := newPool(t, rdb, redisstore.Options{MaxExamined: 50})
	ps := make([]proxy.Proxy, 2000)
	for i := range ps {
		ps[i] = px(fmt.Sprintf("skew-%d", i), now, time.Hour+time.Duration(i)*time.Second)
		ps[i].Region = []string{"us", "ap", "sa"}[i%3]
		if i >= 1000 && i%5 == 0 {
			ps[i].Region = "eu"
		}
	}
	ids := available(t, p, "a", ps...)
	// One eu entry owned by a worker is not extractable: 199 are.
	if err := p.SetOwner(ctx, []proxy.ID{ids[1500]}, "w1"); err != nil {
		t.Fatal(err)
	}
	seen := map[proxy.ID]bool{}
	for call := range 150 {
		res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 10, Fulfillment: extraction.AllOrNothing, Now: now,
			Filters: extraction.Filters{Region: "eu"}})
		if call < 19 {
			if err != nil || res.Returned != 10 {
				t.Fatalf("call %d: %+v, %v; want 10", call, res, err)
			}
			for _, x := range res.Proxies {
				if x.Region != "eu" || seen[x.ID] {
					t.Fatalf("call %d returned %s (region %q) again or off filter", call, x.ID, x.Region)
				}
				seen[x.ID] = true
			}
			continue
		}
		var ins *extraction.InsufficientError
		if !errors.As(err, &ins) || ins.Available != 9 {
			t.Fatalf("call %d: %+v, %v; want insufficient with 9 available", call, res, err)
		}
	}
	res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 10, Fulfillment: extraction.Partial, Now: now, Filters: extraction.Filters{Region: "eu"}})
	if err != nil || res.Returned != 9 {
		t.Fatalf("partial: %+v, %v; want the last 9", res, err)
	}
	// The others are all still there, and still extractable.
	res, err = p.Extract(ctx, extraction.Request{Client: "c", Count: 10, Fulfillment: extraction.AllOrNothing, Now: now, Filters: extraction.Filters{Region: "sa", Protocol: proxy.SchemeHTTP}})
	if err != nil || res.Returned != 10 {
		t.Fatalf("region sa: %+v, %v", res, err)
	}
}

// TestFreeIndexesConsistent runs random admissions, health moves,
// extractions (with random filters), ownership changes, lease reclaims,
// removals and server-side expiries, and checks after each round (and a
// Sweep) that every attribute free index of an upstream is exactly the
// upstream's free index restricted to that attribute, and that the free
// index holds exactly the unowned AVAILABLE entries.
func TestFreeIndexesConsistent(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	p := newPool(t, rdb, redisstore.Options{})
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func(vs ...string) string { return vs[rnd.IntN(len(vs))] }
	type entry struct {
		st    proxy.State
		owner string
	}
	live := map[proxy.ID]*entry{}
	ids := func(ok func(*entry) bool) []proxy.ID {
		var out []proxy.ID
		for id, e := range live {
			if ok(e) {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	any1 := func(ok func(*entry) bool) (proxy.ID, bool) {
		c := ids(ok)
		if len(c) == 0 {
			return "", false
		}
		return c[rnd.IntN(len(c))], true
	}
	avail := func(e *entry) bool { return e.st == proxy.StateAvailable }
	lease, err := p.GrantOwnerLease(ctx, "w2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for round := range 30 {
		for range 40 {
			now := time.Now()
			switch op := rnd.IntN(10); op {
			case 0, 1, 2: // admit a few and make them AVAILABLE
				var ps []proxy.Proxy
				for range 1 + rnd.IntN(3) {
					n++
					usable := time.Hour + time.Duration(rnd.IntN(100))*time.Second
					if rnd.IntN(3) == 0 {
						usable = -time.Duration(1+rnd.IntN(100)) * time.Second // past: Sweep may find it a ghost
					}
					x := px(fmt.Sprintf("r%d", n), now, usable)
					x.ExpiresAt = now.Add(2 * time.Hour)
					x.Key.Scheme = proxy.Scheme(pick("http", "socks5"))
					x.Region, x.Carrier = pick("eu", "us", ""), pick("c1", "c2", "")
					ps = append(ps, x)
				}
				for _, id := range available(t, p, pick("a", "b"), ps...) {
					live[id] = &entry{st: proxy.StateAvailable}
				}
			case 3: // suspect and back, or drain, expire and remove
				if id, ok := any1(avail); ok {
					if rnd.IntN(2) == 0 {
						must(p.Transition(ctx, id, proxy.StateAvailable, proxy.StateSuspect, now))
						if rnd.IntN(2) == 0 {
							must(p.Transition(ctx, id, proxy.StateSuspect, proxy.StateAvailable, now))
						} else {
							live[id].st = proxy.StateSuspect
						}
					} else {
						must(p.Transition(ctx, id, proxy.StateAvailable, proxy.StateDraining, now))
						must(p.Transition(ctx, id, proxy.StateDraining, proxy.StateExpired, now))
						must(p.Remove(ctx, id))
						delete(live, id)
					}
				}
			case 4, 5: // extract with random filters
				f := extraction.Filters{Region: pick("eu", "us", ""), Carrier: pick("c1", "c2", ""), Protocol: proxy.Scheme(pick("http", "socks5", ""))}
				if rnd.IntN(2) == 0 {
					f.Upstreams = []string{pick("a", "b")}
				}
				res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 1 + rnd.IntN(3), Fulfillment: extraction.Partial, Filters: f})
				must(err)
				for _, x := range res.Proxies {
					if live[x.ID] == nil || live[x.ID].owner != "" || (f.Region != "" && x.Region != f.Region) || (f.Carrier != "" && x.Carrier != f.Carrier) || (f.Protocol != "" && x.Key.Scheme != f.Protocol) {
						t.Fatalf("extracted %+v for %+v", x, f)
					}
					live[x.ID].st = proxy.StateExtracted
				}
			case 6: // own or disown
				if id, ok := any1(func(e *entry) bool { return avail(e) && e.owner != "w2" }); ok && rnd.IntN(2) == 0 {
					must(p.SetOwner(ctx, []proxy.ID{id}, "w1"))
					live[id].owner = "w1"
				} else if id, ok := any1(func(e *entry) bool { return e.owner == "w1" }); ok {
					must(p.SetOwner(ctx, []proxy.ID{id}, ""))
					live[id].owner = ""
				}
			case 7: // a leased worker takes some; its lease ends and they are reclaimed
				if id, ok := any1(func(e *entry) bool { return avail(e) && e.owner == "" }); ok {
					must(p.AssignOwner(ctx, lease, []proxy.ID{id}))
					live[id].owner = "w2"
				}
				if rnd.IntN(3) == 0 {
					must(p.ReleaseOwnerLease(ctx, lease))
					cleared, _, err := p.ReclaimOwner(ctx, "w2", 1000)
					must(err)
					for _, id := range cleared {
						live[id].owner = ""
					}
					lease, err = p.GrantOwnerLease(ctx, "w2", time.Minute)
					must(err)
				}
			case 8, 9: // Redis expires a key (of an entry past UsableUntil, as it would)
				if id, ok := any1(func(*entry) bool { return true }); ok {
					x, err := p.Get(ctx, id)
					must(err)
					if x.UsableUntil.Before(now) {
						must(rdb.Del(ctx, redisstore.KeyPrefix(p)+"p:"+string(id)).Err())
						delete(live, id)
					}
				}
			}
		}
		if _, err := p.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		for _, up := range []string{"a", "b"} {
			main, attr, err := redisstore.FreeIndexes(ctx, p, up)
			must(err)
			want := map[string]map[string]float64{}
			for m, score := range main {
				id := redisstore.MemberID(m)
				e := live[id]
				if e == nil || e.st != proxy.StateAvailable || e.owner != "" {
					t.Fatalf("round %d: free index of %s holds %s: %+v", round, up, id, e)
				}
				x, err := p.Get(ctx, id)
				must(err)
				for suf, v := range map[string]string{":r:": x.Region, ":c:": x.Carrier, ":p:": string(x.Key.Scheme)} {
					if v != "" {
						if want[suf+v] == nil {
							want[suf+v] = map[string]float64{}
						}
						want[suf+v][m] = score
					}
				}
			}
			for _, id := range ids(func(e *entry) bool { return avail(e) && e.owner == "" }) {
				x, err := p.Get(ctx, id)
				must(err)
				if x.Upstream != up {
					continue
				}
				found := false
				for m := range main {
					found = found || redisstore.MemberID(m) == id
				}
				if !found {
					t.Fatalf("round %d: free %s missing from the free index of %s", round, id, up)
				}
			}
			maps.DeleteFunc(attr, func(_ string, ms map[string]float64) bool { return len(ms) == 0 })
			if !reflect.DeepEqual(attr, want) {
				t.Fatalf("round %d, upstream %s: attribute indexes\n%v\nwant\n%v", round, up, attr, want)
			}
		}
	}
	if len(live) == 0 {
		t.Fatal("nothing survived: the sequence proves little")
	}
}
