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
	// c comes first and is padded to a cache line, so counters of
	// neighbouring entries do not share one; embedding saves an
	// allocation per proxy.
	c      Counter
	target *Target
	// live: the proxy is in the current (last successfully built)
	// snapshot; alloc: and allocatable there. Anything else is withdrawn
	// (its counter refuses reservations) and, while it has counts,
	// reported as draining.
	live, alloc bool
	// withdrawn mirrors the counter's mark, so a build touches only the
	// counters whose state changes.
	withdrawn bool
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
		out = append(out, worker.Runtime{ID: id, Active: a, Reserved: res, Draining: !e.live || !e.alloc})
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
		return &e.c
	}
	return nil
}

// bind resolves the registry entry of every proxy in ws, creating counters
// for allocatable proxies that have none. It must run with r.mu held. On
// error the registry is left as it was (apart from reclaimed idle
// counters, which nothing could have used).
func (r *Registry) bind(ws *worker.Snapshot, allocatable func(*proxy.Proxy) bool) ([]*regEntry, error) {
	r.reclaim()
	if len(r.m) == 0 && len(ws.Proxies) > 0 {
		// A first snapshot: size the map once instead of growing it.
		r.m = make(map[proxy.ID]*regEntry, min(len(ws.Proxies), r.max))
	}
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
			e.alloc = allocatable(p)
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
		e = &regEntry{mark: epoch, alloc: true}
		r.m[p.ID] = e
		added = append(added, p.ID)
		refs = append(refs, e)
	}
	// Withdraw before the caller publishes: from here on a request still
	// routing on the previous snapshot cannot reserve on a proxy this one
	// dropped.
	for _, e := range r.m {
		e.live = e.mark == epoch
		if w := !e.live || !e.alloc; w != e.withdrawn {
			e.withdrawn = w
			if w {
				e.c.withdraw()
			} else {
				e.c.restore()
			}
		}
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
// previous snapshot and are now idle. They are withdrawn already; retiring
// them (a CAS from "no counts") makes that permanent before the entry is
// forgotten, so a returning proxy gets a fresh counter and the old pointer
// stays dead.
func (r *Registry) reclaim() {
	for id, e := range r.m {
		if !e.live && e.c.retire() {
			delete(r.m, id)
		}
	}
}
