package redisstore_test

import (
	"context"
	"fmt"
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
