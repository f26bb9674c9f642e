package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Pool bounds and defaults.
const (
	// DefaultMaxEntries bounds the entries the pool retains, ended
	// lifecycles awaiting Sweep included: it is the memory bound.
	DefaultMaxEntries = 1_000_000
	// DefaultMaxIdempotencyRecords bounds the extraction results kept for
	// replay.
	DefaultMaxIdempotencyRecords = 100_000
	// DefaultIdempotencyTTL applies when a request carries a key but no TTL.
	DefaultIdempotencyTTL = 10 * time.Minute
	// DefaultHardExpiryGrace is how long past ExpiresAt an entry that the
	// controller never moved to an end state survives before Sweep drops it.
	DefaultHardExpiryGrace = time.Minute
	// DefaultMaxChangeLog bounds the entry changes Changes can report
	// (about 1 MiB of IDs): a consumer further behind re-lists.
	DefaultMaxChangeLog = 1 << 16
)

// ErrPoolFull is returned by Admit when MaxEntries is reached. It is an
// operational bound, not a pool policy: maxSize refusals are counted in
// AdmitResult.Full instead.
var ErrPoolFull = errors.New("activity pool store full")

// PoolOptions configures a Pool. Zero values take the defaults.
type PoolOptions struct {
	// Now is the store clock: admission times, hard-expiry checks in Admit
	// and idempotency record expiry (the equivalent of Redis server TTLs).
	// Extraction eligibility uses Request.Now when set.
	Now                   func() time.Time
	MaxEntries            int
	MaxIdempotencyRecords int
	HardExpiryGrace       time.Duration
	MaxChangeLog          int
}

// Pool is the in-memory activity pool. All methods are safe for concurrent
// use.
//
// Semantics the Redis adapter shares (the contract suite pins them):
//   - The ID of a proxy is proxy.MakeID(Key); Admit derives it when empty
//     and refuses a mismatching one.
//   - A key belongs to one lifecycle. While it lasts, Admit of the same key
//     from any upstream is a duplicate that changes nothing (first source
//     keeps ownership and TTL). The lifecycle ends when the entry is EXPIRED
//     or REMOVED, or its hard expiry (ExpiresAt) has passed whatever its
//     state, EXTRACTED included; then Admit replaces the old entry with a
//     fresh FETCHED one under the new upstream.
//   - Managed = every state except EXTRACTED, EXPIRED and REMOVED; maxSize
//     (when > 0) bounds an upstream's managed entries.
//   - Extraction order: most remaining usable time first (UsableUntil
//     descending; ties, common when a batch shares one expiry, go newest
//     admission first).
//   - reserveForGateway counts AVAILABLE entries usable at the request's
//     time, owned or not, over the request's upstream filter (all upstreams
//     when empty); extraction never takes the pool below it.
//   - SetOwner assigns only AVAILABLE, unowned (or already same-owner)
//     proxies; reassigning needs a clear first. Clearing works in any state.
//   - Remove deletes at once from EXPIRED, UNHEALTHY or REMOVED.
//   - List returns copies sorted by ID; Tags are never shared.
//
// Beyond the contract it keeps a bounded log of changed entries
// (Changes, activitypool.ChangeFeed) and per-owner capacity indexes
// (FreeCapacity), so the controller's publish round and inventory read
// cost what changed, not the pool size.
type Pool struct {
	now        func() time.Time
	maxEntries int
	grace      time.Duration

	mu        sync.RWMutex
	byID      map[proxy.ID]*entry
	upstreams map[string]*upstreamIndex
	counts    [numStates]int
	byState   [numStates]stateList
	free      tree // linkFree
	expiry    tree // linkExpiry
	removed   map[proxy.ID]*entry
	idem      idempotencyCache
	seq       uint64 // admissions so far; orders ties in the indexes
	changes   changeLog
}

const numStates = int(proxy.StateRemoved) + 1

// entry is one proxy plus its index links; only the pool's lock guards it.
type entry struct {
	links [numLinks]link
	// sprev, snext thread the entry through its state's list.
	sprev, snext *entry
	seq          uint64
	prio         uint32
	slots        int64
	up           *upstreamIndex
	p            proxy.Proxy
}

type upstreamIndex struct {
	name    string
	entries map[proxy.ID]*entry
	states  [numStates]int
	managed int
	avail   tree // linkUpAvail
	free    tree // linkUpOwner, unowned entries
	// owned holds one linkUpOwner index per owner with AVAILABLE entries
	// here; an emptied index is dropped, so it is bounded by the workers.
	owned map[string]*tree
}

// ownerTree is the index of u's AVAILABLE entries owned by owner (""
// for the unowned ones); nil when there is none and create is false.
func (u *upstreamIndex) ownerTree(owner string, create bool) *tree {
	if owner == "" {
		return &u.free
	}
	t := u.owned[owner]
	if t == nil && create {
		if u.owned == nil {
			u.owned = map[string]*tree{}
		}
		t = &tree{id: linkUpOwner}
		u.owned[owner] = t
	}
	return t
}

// NewPool returns an empty pool.
func NewPool(o PoolOptions) *Pool {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxIdempotencyRecords <= 0 {
		o.MaxIdempotencyRecords = DefaultMaxIdempotencyRecords
	}
	if o.HardExpiryGrace <= 0 {
		o.HardExpiryGrace = DefaultHardExpiryGrace
	}
	if o.MaxChangeLog <= 0 {
		o.MaxChangeLog = DefaultMaxChangeLog
	}
	return &Pool{
		now:        o.Now,
		maxEntries: o.MaxEntries,
		grace:      o.HardExpiryGrace,
		byID:       make(map[proxy.ID]*entry),
		upstreams:  make(map[string]*upstreamIndex),
		free:       tree{id: linkFree},
		expiry:     tree{id: linkExpiry},
		removed:    make(map[proxy.ID]*entry),
		changes:    changeLog{max: o.MaxChangeLog},
		idem: idempotencyCache{
			max:   o.MaxIdempotencyRecords,
			byKey: make(map[string]*idemRecord),
		},
	}
}

func managedState(s proxy.State) bool {
	switch s {
	case proxy.StateExtracted, proxy.StateExpired, proxy.StateRemoved:
		return false
	}
	return true
}

// lifecycleEnded reports whether e no longer holds its key.
func lifecycleEnded(e *entry, now time.Time) bool {
	switch e.p.State {
	case proxy.StateExpired, proxy.StateRemoved:
		return true
	}
	return !now.Before(e.p.ExpiresAt)
}

func copyProxy(p *proxy.Proxy) proxy.Proxy {
	c := *p
	if p.Tags != nil {
		c.Tags = maps.Clone(p.Tags)
	}
	return c
}

func admitID(p *proxy.Proxy) (proxy.ID, error) {
	if !p.Key.Scheme.Valid() || p.Key.Host == "" || p.Key.Port == 0 {
		return "", fmt.Errorf("invalid proxy key %s", p.Key)
	}
	want := proxy.MakeID(p.Key)
	if p.ID != "" && p.ID != want {
		return "", fmt.Errorf("proxy id %q does not match its key %s", p.ID, p.Key)
	}
	if p.ExpiresAt.IsZero() {
		return "", fmt.Errorf("proxy %s has no expiry", want)
	}
	return want, nil
}

// Admit implements activitypool.Pool. The batch is validated first, so an
// invalid element changes nothing. When MaxEntries is hit the result reports
// what was admitted before, alongside ErrPoolFull.
func (p *Pool) Admit(ctx context.Context, up string, ps []proxy.Proxy, maxSize int) (activitypool.AdmitResult, error) {
	var res activitypool.AdmitResult
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("admit to upstream %q: %w", up, err)
	}
	if up == "" {
		return res, errors.New("admit: empty upstream name")
	}
	ids := make([]proxy.ID, len(ps))
	for i := range ps {
		id, err := admitID(&ps[i])
		if err != nil {
			return res, fmt.Errorf("admit to upstream %q: %w", up, err)
		}
		ids[i] = id
	}
	now := p.now()

	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.upstreamLocked(up)
	defer func() { p.dropIfEmptyLocked(u) }()
	for i := range ps {
		if old, ok := p.byID[ids[i]]; ok {
			if !lifecycleEnded(old, now) {
				res.Duplicates++
				continue
			}
			// The old lifecycle is over; its entry would only wait for Sweep.
			// Deleting it may drop an emptied index, u included.
			p.deleteLocked(old)
			u = p.upstreamLocked(up)
		}
		if maxSize > 0 && u.managed >= maxSize {
			res.Full++
			continue
		}
		if len(p.byID) >= p.maxEntries {
			return res, fmt.Errorf("admit to upstream %q: %d entries: %w", up, len(p.byID), ErrPoolFull)
		}
		e := &entry{p: copyProxy(&ps[i])}
		e.p.ID = ids[i]
		e.p.Upstream = up
		e.p.State = proxy.StateFetched
		e.p.Owner = ""
		e.p.ExtractedAt = time.Time{}
		e.p.ExtractedByClient = ""
		if e.p.CreatedAt.IsZero() {
			e.p.CreatedAt = now
		}
		if e.p.UsableUntil.IsZero() {
			e.p.UsableUntil = e.p.ExpiresAt
		}
		e.slots = max(e.p.MaxConcurrency, 0)
		p.insertLocked(u, e)
		res.Added = append(res.Added, e.p.ID)
	}
	return res, nil
}

func (p *Pool) upstreamLocked(name string) *upstreamIndex {
	u := p.upstreams[name]
	if u == nil {
		u = &upstreamIndex{
			name:    name,
			entries: make(map[proxy.ID]*entry),
			avail:   tree{id: linkUpAvail},
			free:    tree{id: linkUpOwner},
		}
		p.upstreams[name] = u
	}
	return u
}

// dropIfEmptyLocked keeps the upstream map bounded by live upstreams.
func (p *Pool) dropIfEmptyLocked(u *upstreamIndex) {
	if len(u.entries) == 0 && p.upstreams[u.name] == u {
		delete(p.upstreams, u.name)
	}
}

func (p *Pool) insertLocked(u *upstreamIndex, e *entry) {
	p.seq++
	e.seq = p.seq
	e.prio = rand.Uint32()
	e.up = u
	p.byID[e.p.ID] = e
	u.entries[e.p.ID] = e
	p.expiry.insert(e, nanos(e.p.ExpiresAt))
	p.enterLocked(e)
}

func (p *Pool) deleteLocked(e *entry) {
	p.changes.record(e.p.ID)
	p.leaveLocked(e)
	p.expiry.remove(e)
	delete(p.byID, e.p.ID)
	delete(e.up.entries, e.p.ID)
	p.dropIfEmptyLocked(e.up)
}

// enterLocked adds e to the counters and indexes of its state and owner
// and logs the change; leaveLocked undoes it. Every state or owner change
// is leave, mutate, enter, so the indexes cannot drift from the entries
// (and leave finds the owner index enter used).
func (p *Pool) enterLocked(e *entry) {
	p.changes.record(e.p.ID)
	s, u := e.p.State, e.up
	p.byState[s].push(e)
	p.counts[s]++
	u.states[s]++
	if managedState(s) {
		u.managed++
	}
	switch s {
	case proxy.StateAvailable:
		k := nanos(e.p.UsableUntil)
		u.avail.insert(e, k)
		u.ownerTree(e.p.Owner, true).insert(e, k)
		if e.p.Owner == "" {
			p.free.insert(e, k)
		}
	case proxy.StateRemoved:
		p.removed[e.p.ID] = e
	}
}

func (p *Pool) leaveLocked(e *entry) {
	s, u := e.p.State, e.up
	p.byState[s].remove(e)
	p.counts[s]--
	u.states[s]--
	if managedState(s) {
		u.managed--
	}
	u.avail.remove(e)
	if t := u.ownerTree(e.p.Owner, false); t != nil {
		t.remove(e)
		if t.root == nil && e.p.Owner != "" {
			delete(u.owned, e.p.Owner)
		}
	}
	p.free.remove(e)
	delete(p.removed, e.p.ID)
}

// stateList is the entries of one state, least recently re-indexed
// (entered the state or changed owner) first.
type stateList struct{ head, tail *entry }

func (l *stateList) push(e *entry) {
	e.sprev, e.snext = l.tail, nil
	if l.tail != nil {
		l.tail.snext = e
	} else {
		l.head = e
	}
	l.tail = e
}

func (l *stateList) remove(e *entry) {
	if e.sprev != nil {
		e.sprev.snext = e.snext
	} else {
		l.head = e.snext
	}
	if e.snext != nil {
		e.snext.sprev = e.sprev
	} else {
		l.tail = e.sprev
	}
	e.sprev, e.snext = nil, nil
}

func (p *Pool) setStateLocked(e *entry, to proxy.State) {
	p.leaveLocked(e)
	e.p.State = to
	p.enterLocked(e)
}

// Get implements activitypool.Pool.
func (p *Pool) Get(ctx context.Context, id proxy.ID) (proxy.Proxy, error) {
	if err := ctx.Err(); err != nil {
		return proxy.Proxy{}, fmt.Errorf("get proxy %s: %w", id, err)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	e := p.byID[id]
	if e == nil {
		return proxy.Proxy{}, fmt.Errorf("get proxy %s: %w", id, activitypool.ErrNotFound)
	}
	return copyProxy(&e.p), nil
}

// List implements activitypool.Pool. Results are sorted by ID; with a Limit
// and a state filter the subset is the soonest to expire (hard expiry), as
// with the Redis pool, otherwise arbitrary.
func (p *Pool) List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list proxies: %w", err)
	}
	var want [numStates]bool
	for _, s := range f.States {
		if int(s) < numStates {
			want[s] = true
		}
	}
	out := p.listLocked(f, want)
	slices.SortFunc(out, func(a, b proxy.Proxy) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// listLocked walks the requested states' lists when they are smaller than
// the upstream's entries, so listing a rare state of a large pool costs
// that state's size, not the pool's. When a Limit leaves some out, it
// walks the expiry index instead and keeps the soonest to expire, as
// Redis's List does (the lifecycle relies on it to find the due ones
// first): O(Limit) when the states are most of the pool.
func (p *Pool) listLocked(f activitypool.Filter, want [numStates]bool) []proxy.Proxy {
	p.mu.RLock()
	defer p.mu.RUnlock()
	src := p.byID
	var u *upstreamIndex
	if f.Upstream != "" {
		if u = p.upstreams[f.Upstream]; u == nil {
			return []proxy.Proxy{}
		}
		src = u.entries
	}
	out := []proxy.Proxy{}
	full := func() bool { return f.Limit > 0 && len(out) >= f.Limit }
	inStates := 0
	for s, ok := range want {
		if ok {
			inStates += p.counts[s]
		}
	}
	switch {
	case len(f.States) > 0 && f.Limit > 0 && min(inStates, len(src)) > f.Limit:
		p.expiry.ascendTo(math.MaxInt64, func(e *entry) bool {
			if want[e.p.State] && (u == nil || e.up == u) {
				out = append(out, copyProxy(&e.p))
			}
			return !full()
		})
		return out
	case len(f.States) > 0 && inStates <= len(src):
		for s, ok := range want {
			for e := p.byState[s].head; ok && e != nil; e = e.snext {
				if u == nil || e.up == u {
					out = append(out, copyProxy(&e.p))
				}
			}
		}
		return out
	}
	for _, e := range src {
		if full() {
			break
		}
		if len(f.States) > 0 && !want[e.p.State] {
			continue
		}
		out = append(out, copyProxy(&e.p))
	}
	return out
}

// Transition implements activitypool.Pool. The edge is validated before the
// lookup: an illegal edge is a caller bug whatever the stored state. at is
// recorded as ExtractedAt on a move to EXTRACTED.
func (p *Pool) Transition(ctx context.Context, id proxy.ID, from, to proxy.State, at time.Time) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("transition proxy %s: %w", id, err)
	}
	if err := proxy.Transition(from, to); err != nil {
		return fmt.Errorf("transition proxy %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.byID[id]
	if e == nil {
		return fmt.Errorf("transition proxy %s: %w", id, activitypool.ErrNotFound)
	}
	if e.p.State != from {
		return fmt.Errorf("transition proxy %s %s -> %s: state is %s: %w", id, from, to, e.p.State, activitypool.ErrConflict)
	}
	if to == proxy.StateExtracted {
		e.p.ExtractedAt = at
	}
	p.setStateLocked(e, to)
	return nil
}

// RecordHealth implements activitypool.Pool. From == To records an
// observation without a state change (a further failure while SUSPECT, a
// pass while AVAILABLE). Latency is only taken from successful checks: a
// timeout's duration says nothing about the proxy's speed.
func (p *Pool) RecordHealth(ctx context.Context, h activitypool.Health) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record health of proxy %s: %w", h.ID, err)
	}
	if h.From != h.To {
		if err := proxy.Transition(h.From, h.To); err != nil {
			return fmt.Errorf("record health of proxy %s: %w", h.ID, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.byID[h.ID]
	if e == nil {
		return fmt.Errorf("record health of proxy %s: %w", h.ID, activitypool.ErrNotFound)
	}
	if e.p.State != h.From {
		return fmt.Errorf("record health of proxy %s %s -> %s: state is %s: %w", h.ID, h.From, h.To, e.p.State, activitypool.ErrConflict)
	}
	e.p.LastCheckedAt = h.CheckedAt
	if h.Success {
		e.p.LastSuccessAt = h.CheckedAt
		e.p.Latency = h.Latency
	}
	e.p.ConsecutiveFails = h.Fails
	if h.From != h.To {
		p.setStateLocked(e, h.To)
	} else {
		p.changes.record(e.p.ID)
	}
	return nil
}

// Remove implements activitypool.Pool.
func (p *Pool) Remove(ctx context.Context, id proxy.ID) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remove proxy %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.byID[id]
	if e == nil {
		return fmt.Errorf("remove proxy %s: %w", id, activitypool.ErrNotFound)
	}
	switch e.p.State {
	case proxy.StateExpired, proxy.StateUnhealthy, proxy.StateRemoved:
	default:
		return fmt.Errorf("remove proxy %s: %w", id, &proxy.TransitionError{From: e.p.State, To: proxy.StateRemoved})
	}
	p.deleteLocked(e)
	return nil
}

// SetOwner implements activitypool.Pool. The batch is all or nothing:
// ErrNotFound or ErrConflict leaves every proxy as it was.
func (p *Pool) SetOwner(ctx context.Context, ids []proxy.ID, owner string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set owner: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	es := make([]*entry, len(ids))
	for i, id := range ids {
		e := p.byID[id]
		if e == nil {
			return fmt.Errorf("set owner of proxy %s: %w", id, activitypool.ErrNotFound)
		}
		if owner != "" {
			if e.p.State != proxy.StateAvailable {
				return fmt.Errorf("set owner of proxy %s: state is %s: %w", id, e.p.State, activitypool.ErrConflict)
			}
			if e.p.Owner != "" && e.p.Owner != owner {
				return fmt.Errorf("set owner of proxy %s: owned by another worker: %w", id, activitypool.ErrConflict)
			}
		}
		es[i] = e
	}
	for _, e := range es {
		if e.p.Owner == owner {
			continue
		}
		p.leaveLocked(e)
		e.p.Owner = owner
		p.enterLocked(e)
	}
	return nil
}

// Counts implements activitypool.Pool; every state is present, zero or not.
func (p *Pool) Counts(ctx context.Context) (map[proxy.State]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("count proxies: %w", err)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make(map[proxy.State]int, numStates)
	for _, s := range proxy.States() {
		out[s] = p.counts[s]
	}
	return out, nil
}

// Inventory implements activitypool.Pool in O(log n): Managed and Pending
// are maintained counters, Available and AvailableSlots come from the
// upstream's AVAILABLE index ordered by UsableUntil. Worker active/reserved
// counts are the controller's to subtract.
func (p *Pool) Inventory(ctx context.Context, up string, now time.Time) (upstream.Inventory, error) {
	if err := ctx.Err(); err != nil {
		return upstream.Inventory{}, fmt.Errorf("inventory of upstream %q: %w", up, err)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	u := p.upstreams[up]
	if u == nil {
		return upstream.Inventory{}, nil
	}
	n, _, slots := u.avail.countAbove(nanos(now))
	return upstream.Inventory{
		Managed:        u.managed,
		Available:      n,
		AvailableSlots: slots,
		Pending:        u.states[proxy.StateFetched] + u.states[proxy.StateChecking],
	}, nil
}

// FreeCapacity returns, over the AVAILABLE proxies of upstream up usable
// at now, how many have a free slot and the free slots in all. A proxy's
// free slots are its MaxConcurrency when unowned; MaxConcurrency minus
// used[owner][id], never below zero, when its owner is a key of used; none
// when its owner is not (a worker nobody reports for: fail closed). It
// costs O(owners · log n + the used entries of those owners), never a
// walk of the upstream.
func (p *Pool) FreeCapacity(ctx context.Context, up string, now time.Time, used map[string]map[proxy.ID]int64) (int, int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, fmt.Errorf("free capacity of upstream %q: %w", up, err)
	}
	floor := nanos(now)
	p.mu.RLock()
	defer p.mu.RUnlock()
	u := p.upstreams[up]
	if u == nil {
		return 0, 0, nil
	}
	_, n, slots := u.free.countAbove(floor)
	for owner, t := range u.owned {
		m, known := used[owner]
		if !known {
			continue
		}
		_, on, os := t.countAbove(floor)
		for id, k := range m {
			e := u.entries[id]
			if k <= 0 || e == nil || e.p.State != proxy.StateAvailable || e.p.Owner != owner ||
				e.slots == 0 || e.links[linkUpOwner].key <= floor {
				continue
			}
			os -= min(k, e.slots)
			if k >= e.slots {
				on--
			}
		}
		n, slots = n+on, slots+os
	}
	return n, slots, nil
}

// Extract implements activitypool.Pool in one critical section: replay
// lookup, selection, the reserve check, the moves to EXTRACTED and the
// idempotency write happen under one lock, as in the Redis script.
//
// Selection walks the unowned-AVAILABLE index from the most remaining
// usable time down and stops at the first entry no longer usable, so a
// request costs O(log n + skipped), where skipped are usable entries that
// fail the filters.
func (p *Pool) Extract(ctx context.Context, req extraction.Request) (extraction.Result, error) {
	if err := ctx.Err(); err != nil {
		return extraction.Result{}, fmt.Errorf("extract: %w", err)
	}
	if err := req.Validate(); err != nil {
		return extraction.Result{}, fmt.Errorf("extract: %w", err)
	}
	clock := p.now()
	now := req.Now
	if now.IsZero() {
		now = clock
	}
	fp := fingerprintOf(&req)

	p.mu.Lock()
	defer p.mu.Unlock()
	if req.IdempotencyKey != "" {
		if rec, ok := p.idem.get(req.IdempotencyKey, clock); ok {
			if rec.fp != fp {
				return extraction.Result{}, fmt.Errorf("extract: %w", extraction.ErrIdempotencyConflict)
			}
			return rec.replay(), nil
		}
	}
	picked := p.selectLocked(&req, now)
	if req.ReserveForGateway > 0 {
		room := max(p.usableAvailableLocked(req.Filters.Upstreams, now)-req.ReserveForGateway, 0)
		if len(picked) > room {
			picked = picked[:room]
		}
	}
	if len(picked) < req.Count && req.Fulfillment == extraction.AllOrNothing {
		return extraction.Result{}, fmt.Errorf("extract: %w", &extraction.InsufficientError{Requested: req.Count, Available: len(picked)})
	}
	res := extraction.Result{Requested: req.Count, Returned: len(picked), Proxies: make([]proxy.Proxy, len(picked))}
	for i, e := range picked {
		e.p.ExtractedAt = now
		e.p.ExtractedByClient = req.Client
		p.setStateLocked(e, proxy.StateExtracted)
		res.Proxies[i] = copyProxy(&e.p)
	}
	if req.IdempotencyKey != "" {
		ttl := req.IdempotencyTTL
		if ttl <= 0 {
			ttl = DefaultIdempotencyTTL
		}
		p.idem.put(req.IdempotencyKey, fp, res, clock.Add(ttl), clock)
	}
	return res, nil
}

// selectLocked returns up to req.Count eligible unowned entries in
// extraction order.
func (p *Pool) selectLocked(req *extraction.Request, now time.Time) []*entry {
	floor := nanos(now)
	f := &req.Filters
	collect := func(t *tree, out []*entry) []*entry {
		start := len(out)
		t.descendAbove(floor, func(e *entry) bool {
			if f.Eligible(&e.p, now) {
				out = append(out, e)
			}
			return len(out)-start < req.Count
		})
		return out
	}
	ups := distinct(f.Upstreams)
	if len(ups) == 0 {
		return collect(&p.free, nil)
	}
	// The best Count overall are among each upstream's best Count.
	var out []*entry
	for _, name := range ups {
		if u := p.upstreams[name]; u != nil {
			out = collect(&u.free, out)
		}
	}
	if len(ups) > 1 {
		t := &p.free
		slices.SortFunc(out, func(a, b *entry) int {
			if t.less(b, a) {
				return -1
			}
			return 1
		})
		if len(out) > req.Count {
			out = out[:req.Count]
		}
	}
	return out
}

// usableAvailableLocked counts AVAILABLE entries usable at now over the
// named upstreams, or all of them.
func (p *Pool) usableAvailableLocked(names []string, now time.Time) int {
	floor := nanos(now)
	total := 0
	if len(names) == 0 {
		for _, u := range p.upstreams {
			n, _, _ := u.avail.countAbove(floor)
			total += n
		}
		return total
	}
	for _, name := range distinct(names) {
		if u := p.upstreams[name]; u != nil {
			n, _, _ := u.avail.countAbove(floor)
			total += n
		}
	}
	return total
}

func distinct(names []string) []string {
	if len(names) < 2 {
		return names
	}
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// SweepResult reports what one Sweep deleted.
type SweepResult struct {
	// Removed entries were in REMOVED.
	Removed int
	// Ended entries were EXTRACTED or EXPIRED and past their hard expiry.
	Ended int
	// Abandoned entries were in a live state past hard expiry plus the
	// grace: the controller lost track of them. Redis key TTLs do the same.
	Abandoned int
	// Idempotency records that had expired.
	Idempotency int
}

// Sweep is the embedded pool's housekeeping, which Redis does with key
// TTLs: it deletes REMOVED entries, EXTRACTED and EXPIRED entries past
// ExpiresAt, live entries past ExpiresAt plus HardExpiryGrace, and expired
// idempotency records. The controller calls it periodically; it costs
// O(deleted · log n) plus the entries inside the grace window.
func (p *Pool) Sweep(now time.Time) SweepResult {
	var res SweepResult
	p.mu.Lock()
	defer p.mu.Unlock()
	gone := make([]*entry, 0, len(p.removed))
	for _, e := range p.removed {
		gone = append(gone, e)
	}
	res.Removed = len(gone)
	abandonBefore := nanos(now.Add(-p.grace))
	p.expiry.ascendTo(nanos(now), func(e *entry) bool {
		switch e.p.State {
		case proxy.StateRemoved:
		case proxy.StateExtracted, proxy.StateExpired:
			gone = append(gone, e)
			res.Ended++
		default:
			if e.links[linkExpiry].key <= abandonBefore {
				gone = append(gone, e)
				res.Abandoned++
			}
		}
		return true
	})
	for _, e := range gone {
		p.deleteLocked(e)
	}
	res.Idempotency = p.idem.evictExpired(now)
	return res
}

// PoolStats are the store's own gauges for the controller's metrics.
type PoolStats struct {
	Entries            int
	Upstreams          int
	IdempotencyRecords int
	// IdempotencyEvicted counts unexpired records dropped because the
	// bound was reached: replay protection lost for those keys.
	IdempotencyEvicted uint64
}

// Stats returns the current gauges.
func (p *Pool) Stats() PoolStats {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return PoolStats{
		Entries:            len(p.byID),
		Upstreams:          len(p.upstreams),
		IdempotencyRecords: len(p.idem.byKey),
		IdempotencyEvicted: p.idem.evicted,
	}
}

var _ activitypool.Pool = (*Pool)(nil)
