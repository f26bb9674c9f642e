package snapshot

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// DefaultMaxEntries bounds a registry when the caller gives no bound. It is
// sized for the 100k-proxy snapshot of seed 000 §17.2 plus a generation of
// draining proxies from short-TTL rotation.
const DefaultMaxEntries = 250_000

// BoundError refuses a build that would hold more counters than the bound.
type BoundError struct {
	Max, Need int
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("building snapshot: %d proxy counters needed, registry bound is %d", e.Need, e.Max)
}

// Registry holds the runtime counters of every proxy the worker currently
// serves or still drains, keyed by proxy ID. The map is only touched by
// Build and Runtime, never by the request path: a snapshot entry carries a
// direct pointer to its counter. One mutex is enough for those two
// off-path callers; the counters themselves are independent atomics, which
// is the sharding seed 000 §5 asks for.
type Registry struct {
	mu    sync.Mutex
	max   int
	now   func() time.Time
	epoch uint64
	m     map[proxy.ID]*regEntry
	// scratch is reused between builds: the entry found for each proxy of
	// the snapshot being built.
	scratch []*regEntry
	added   []proxy.ID
}

type regEntry struct {
	c      *Counter
	target *Target
	// live: the proxy is in the current (last successfully built)
	// snapshot. A non-live entry with counts is draining.
	live bool
	// mark is the epoch of the last build that saw this entry.
	mark uint64
}

// NewRegistry returns an empty registry bounded to maxEntries counters (0
// means DefaultMaxEntries). now stamps built snapshots; nil means time.Now.
func NewRegistry(maxEntries int, now func() time.Time) *Registry {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	if now == nil {
		now = time.Now
	}
	return &Registry{max: maxEntries, now: now, m: make(map[proxy.ID]*regEntry)}
}

// Max is the bound on entries.
func (r *Registry) Max() int { return r.max }

// Len is the number of counters held, live and draining.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// Runtime reports the counts of every proxy that has any (a sparse list),
// sorted by ID. Proxies no longer in the current snapshot are flagged as
// draining. Active and reserved of one proxy come from one atomic load.
func (r *Registry) Runtime() []worker.Runtime {
	r.mu.Lock()
	out := make([]worker.Runtime, 0, 16)
	for id, e := range r.m {
		a, res := e.c.Counts()
		if a == 0 && res == 0 {
			continue
		}
		out = append(out, worker.Runtime{ID: id, Active: a, Reserved: res, Draining: !e.live})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Counter returns the counter of id, or nil; for tests and diagnostics.
func (r *Registry) Counter(id proxy.ID) *Counter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.m[id]; e != nil {
		return e.c
	}
	return nil
}

// bind resolves the registry entry of every proxy in ws, creating counters
// for allocatable proxies that have none. It must run with r.mu held. On
// error the registry is left as it was (apart from reclaimed idle
// counters, which nothing could have used).
func (r *Registry) bind(ws *worker.Snapshot, allocatable func(*proxy.Proxy) bool) ([]*regEntry, error) {
	r.reclaim()
	r.epoch++
	epoch := r.epoch
	refs := r.scratch[:0]
	added := r.added[:0]
	fail := func(err error) ([]*regEntry, error) {
		for _, id := range added {
			delete(r.m, id)
		}
		r.scratch, r.added = refs[:0], added[:0]
		return nil, err
	}
	for i := range ws.Proxies {
		p := &ws.Proxies[i]
		if p.ID == "" {
			return fail(fmt.Errorf("building snapshot: proxy %d has an empty id", i))
		}
		e := r.m[p.ID]
		if e != nil {
			if e.mark == epoch {
				return fail(fmt.Errorf("building snapshot: duplicate proxy id %s", p.ID))
			}
			e.mark = epoch
			refs = append(refs, e)
			continue
		}
		if !allocatable(p) {
			// No counter: nothing can allocate on it, and it has no
			// counts to report.
			refs = append(refs, nil)
			continue
		}
		if len(r.m) >= r.max {
			return fail(&BoundError{Max: r.max, Need: len(r.m) + 1 + r.remainingNew(ws, i+1, allocatable)})
		}
		e = &regEntry{c: new(Counter), mark: epoch}
		r.m[p.ID] = e
		added = append(added, p.ID)
		refs = append(refs, e)
	}
	for _, e := range r.m {
		e.live = e.mark == epoch
	}
	r.scratch, r.added = refs, added[:0]
	return refs, nil
}

// remainingNew counts the allocatable proxies from index i on that have no
// counter yet; it only feeds the error message.
func (r *Registry) remainingNew(ws *worker.Snapshot, i int, allocatable func(*proxy.Proxy) bool) int {
	n := 0
	for ; i < len(ws.Proxies); i++ {
		p := &ws.Proxies[i]
		if r.m[p.ID] == nil && allocatable(p) {
			n++
		}
	}
	return n
}

// reclaim deletes counters of proxies that were already absent from the
// previous snapshot and are now idle. Retiring first (a CAS from zero)
// closes the race with a request still routing on an older snapshot: it
// can no longer reserve on the reclaimed counter.
func (r *Registry) reclaim() {
	for id, e := range r.m {
		if !e.live && e.c.retire() {
			delete(r.m, id)
		}
	}
}
