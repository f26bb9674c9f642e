package embedded

import (
	"container/heap"
	"strings"
	"time"

	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// fingerprint is what makes two extraction requests "the same" for an
// idempotency key. ReserveForGateway, IdempotencyTTL and Now are left out:
// they come from configuration and the clock, not from the client.
type fingerprint struct {
	client            string
	count             int
	fulfillment       extraction.Fulfillment
	protocol          proxy.Scheme
	region, carrier   string
	upstreams         string // sorted, deduplicated, NUL-joined
	minRemainingTTL   time.Duration
	maxHealthCheckAge time.Duration
}

func fingerprintOf(r *extraction.Request) fingerprint {
	return fingerprint{
		client:            r.Client,
		count:             r.Count,
		fulfillment:       r.Fulfillment,
		protocol:          r.Filters.Protocol,
		region:            r.Filters.Region,
		carrier:           r.Filters.Carrier,
		upstreams:         strings.Join(distinct(r.Filters.Upstreams), "\x00"),
		minRemainingTTL:   r.Filters.MinRemainingTTL,
		maxHealthCheckAge: r.Filters.MaxHealthCheckAge,
	}
}

type idemRecord struct {
	key     string
	fp      fingerprint
	res     extraction.Result
	expires time.Time
	index   int // position in the heap
}

func (r *idemRecord) replay() extraction.Result {
	out := r.res
	out.Proxies = make([]proxy.Proxy, len(r.res.Proxies))
	for i := range r.res.Proxies {
		out.Proxies[i] = copyProxy(&r.res.Proxies[i])
	}
	out.Replayed = true
	return out
}

// idempotencyCache is a bounded map of extraction results with a min-heap
// on expiry. When full of live records it drops the one expiring soonest:
// its replay window is the shortest left, so the loss is the smallest, and
// extraction keeps working rather than failing on a full cache.
type idempotencyCache struct {
	max     int
	byKey   map[string]*idemRecord
	heap    idemHeap
	evicted uint64
}

func (c *idempotencyCache) get(key string, now time.Time) (*idemRecord, bool) {
	r := c.byKey[key]
	if r == nil {
		return nil, false
	}
	if !now.Before(r.expires) {
		c.drop(r)
		return nil, false
	}
	return r, true
}

func (c *idempotencyCache) put(key string, fp fingerprint, res extraction.Result, expires, now time.Time) {
	if old := c.byKey[key]; old != nil {
		c.drop(old)
	}
	c.evictExpired(now)
	for len(c.byKey) >= c.max && len(c.heap) > 0 {
		c.drop(c.heap[0])
		c.evicted++
	}
	stored := res
	stored.Proxies = make([]proxy.Proxy, len(res.Proxies))
	for i := range res.Proxies {
		stored.Proxies[i] = copyProxy(&res.Proxies[i])
	}
	r := &idemRecord{key: key, fp: fp, res: stored, expires: expires}
	c.byKey[key] = r
	heap.Push(&c.heap, r)
}

func (c *idempotencyCache) drop(r *idemRecord) {
	heap.Remove(&c.heap, r.index)
	delete(c.byKey, r.key)
}

// evictExpired drops every record expired at now and returns how many.
func (c *idempotencyCache) evictExpired(now time.Time) int {
	n := 0
	for len(c.heap) > 0 && !now.Before(c.heap[0].expires) {
		c.drop(c.heap[0])
		n++
	}
	return n
}

type idemHeap []*idemRecord

func (h idemHeap) Len() int           { return len(h) }
func (h idemHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h idemHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *idemHeap) Push(x any) {
	r := x.(*idemRecord)
	r.index = len(*h)
	*h = append(*h, r)
}
func (h *idemHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return r
}
