package controller

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// 64 concurrent extractors over many rounds, through Controller.Extract,
// with every proxy owned by the gateway so each extraction goes through the
// revoke path: no proxy is ever returned twice and the totals add up.
func TestConcurrentExtractorsThroughController(t *testing.T) {
	const (
		total     = 240
		extractor = 64
		rounds    = 5
	)
	v := startVendor(t, nil)
	v.SetMode(testenv.VendorEmpty)
	cfg := parseConfig(t, `
  - name: vendor-a
    provider: {plugin: vendor, params: {url: "`+v.URL()+`/v1/proxies"}}
    pool: {minimum: 1, target: 2, maxSize: 1000}
    check: {interval: 1h}`, "")
	ctx := context.Background()
	wd := startWorldWith(t, cfg, worldOptions{beforeRun: func(wd *world) {
		if _, err := ctltest.AddAvailable(ctx, wd.pool, "vendor-a", total, 1000, time.Now(), time.Hour); err != nil {
			t.Fatal(err)
		}
	}})
	within(t, "every proxy owned by the gateway", func() bool { s := wd.w.Last(); return s != nil && len(s.Proxies) == total })

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		seen     = map[proxy.ID]int{}
		returned int
		refused  int
	)
	for i := range extractor {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				req := extraction.Request{Client: "c" + string(rune('A'+i%8)), Count: (i+r)%4 + 1}
				if (i+r)%5 == 0 {
					req.Fulfillment = extraction.AllOrNothing
				}
				res, err := wd.c.Extract(ctx, req)
				if errors.Is(err, extraction.ErrInsufficient) && req.Fulfillment == extraction.AllOrNothing {
					mu.Lock()
					refused++
					mu.Unlock()
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if res.Returned != len(res.Proxies) || res.Requested != req.Count || res.Returned > req.Count ||
					(req.Fulfillment == extraction.AllOrNothing && res.Returned != req.Count) {
					t.Errorf("result %+v for %+v", res, req)
				}
				mu.Lock()
				for _, p := range res.Proxies {
					seen[p.ID]++
					if p.State != proxy.StateExtracted || p.Password == "" {
						t.Errorf("extracted proxy %+v", p)
					}
				}
				returned += res.Returned
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for id, n := range seen {
		if n > 1 {
			t.Fatalf("%s returned %d times", id, n)
		}
	}
	counts, err := wd.pool.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if returned != len(seen) || counts[proxy.StateExtracted] != returned || counts[proxy.StateAvailable] != total-returned {
		t.Fatalf("returned %d (%d distinct); store: %d EXTRACTED, %d AVAILABLE of %d", returned, len(seen), counts[proxy.StateExtracted], counts[proxy.StateAvailable], total)
	}
	if returned != total {
		t.Fatalf("returned %d of %d with more requested than available", returned, total)
	}
	st, err := wd.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Extraction.Requests != extractor*rounds || st.Extraction.Returned != int64(returned) {
		t.Fatalf("extraction counters = %+v, want %d requests and %d returned", st.Extraction, extractor*rounds, returned)
	}
	if wd.metric(t, "proxypool_extraction_revoked_total", nil) != float64(total) {
		t.Fatalf("revoked %v, want every proxy taken from the gateway first", wd.metric(t, "proxypool_extraction_revoked_total", nil))
	}
	if refused == 0 {
		t.Log("no allOrNothing request was refused")
	}
	within(t, "a snapshot after the last extraction", func() bool { return len(wd.w.Last().Proxies) == 0 })
}
