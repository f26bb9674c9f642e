package distribution

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

var availableOnly = []proxy.State{proxy.StateAvailable}

// relistEvery bounds how long a mirror follows a change feed without
// listing the store again: whatever a feed could miss (a store rolled back
// to an older copy of itself and written past the version the mirror
// holds) is put right within this long, for one listing of the pool.
const relistEvery = 5 * time.Minute

// mirror is the publisher's copy of the store's AVAILABLE proxies, sorted
// by ID. Over an activitypool.ChangeFeed a sync applies what changed since
// the last one (O(k log k) for k changes plus an O(n) pointer merge); over
// any other store, and after a Reset, it re-lists.
//
// Proxies are held by pointer and never modified. Once a proxy is copied
// into a published list, the mirror points at that copy (inOut) instead of
// keeping its own, so the publisher holds the pool once, not twice; a
// proxy a rebuilt list leaves out gets a copy of its own again, so an old
// list is never kept alive by the mirror.
type mirror struct {
	store Store
	feed  activitypool.ChangeFeed // nil: re-list on every sync
	limit int

	version  uint64
	synced   bool      // version is meaningful
	listedAt time.Time // the last listing, on now
	now      func() time.Time
	sorted   []slot
	spare    []slot // the merge's other buffer
	unowned  map[proxy.ID]struct{}
	owned    map[string]int // per owner, "" included
	// dirty marks the owners whose proxies changed since clean; all: every
	// owner (a re-list).
	dirty map[string]bool
	all   bool
}

type slot struct {
	p     *proxy.Proxy
	inOut bool // p points into a published list
}

func newMirror(s Store, limit int) *mirror {
	m := &mirror{store: s, limit: limit, unowned: map[proxy.ID]struct{}{}, owned: map[string]int{}, dirty: map[string]bool{}, now: time.Now}
	m.feed, _ = s.(activitypool.ChangeFeed)
	return m
}

// sync brings the mirror up to the store.
func (m *mirror) sync(ctx context.Context) error {
	if m.feed == nil {
		return m.reload(ctx)
	}
	since := m.version
	if !m.synced || m.now().Sub(m.listedAt) >= relistEvery {
		since = math.MaxUint64 // no version of the store's: a cheap Reset
	}
	ch, err := m.feed.Changes(ctx, since, availableOnly)
	if err != nil {
		return err
	}
	if ch.Reset || !m.synced || since == math.MaxUint64 {
		// Listing after reading the version may see changes made after
		// it; the next sync reports them again, and applying a proxy's
		// current state twice is harmless.
		if err := m.reload(ctx); err != nil {
			return err
		}
	} else {
		m.apply(ch.Changed, ch.Gone)
	}
	m.version, m.synced = ch.Version, true
	return nil
}

func (m *mirror) reload(ctx context.Context) error {
	m.synced = false
	listedAt := m.now()
	ps, err := m.store.List(ctx, activitypool.Filter{States: availableOnly, Limit: m.limit})
	if err != nil {
		return err
	}
	m.listedAt = listedAt
	slices.SortFunc(ps, func(a, b proxy.Proxy) int { return cmp.Compare(a.ID, b.ID) })
	clear(m.sorted)
	m.sorted = m.sorted[:0]
	clear(m.unowned)
	clear(m.owned)
	for i := range ps {
		p := &ps[i]
		if m.feed != nil {
			// Followed for long: a proxy of its own, or the listed array
			// would live as long as any one of its proxies. Without a
			// feed the next sync replaces the array anyway.
			p = new(proxy.Proxy)
			*p = ps[i]
		}
		m.sorted = append(m.sorted, slot{p: p})
		m.count(p, 1)
	}
	m.all = true
	return nil
}

// apply merges one batch of changes: changed proxies replace or join,
// gone ones leave.
func (m *mirror) apply(changed []proxy.Proxy, gone []proxy.ID) {
	type op struct {
		id proxy.ID
		p  *proxy.Proxy // nil: delete
	}
	ops := make([]op, 0, len(changed)+len(gone))
	for i := range changed {
		if changed[i].State != proxy.StateAvailable {
			ops = append(ops, op{id: changed[i].ID})
			continue
		}
		// A copy of its own: pointing into changed would keep the whole
		// batch alive as long as any one of its proxies.
		p := new(proxy.Proxy)
		*p = changed[i]
		ops = append(ops, op{id: p.ID, p: p})
	}
	for _, id := range gone {
		ops = append(ops, op{id: id})
	}
	if len(ops) == 0 {
		return
	}
	slices.SortStableFunc(ops, func(a, b op) int { return cmp.Compare(a.id, b.id) })
	out := m.spare[:0]
	i := 0
	for j, o := range ops {
		if j+1 < len(ops) && ops[j+1].id == o.id {
			continue // the later report of one proxy wins
		}
		for i < len(m.sorted) && m.sorted[i].p.ID < o.id {
			out = append(out, m.sorted[i])
			i++
		}
		if i < len(m.sorted) && m.sorted[i].p.ID == o.id {
			m.count(m.sorted[i].p, -1)
			i++
		}
		if o.p != nil {
			m.count(o.p, 1)
			out = append(out, slot{p: o.p})
		}
	}
	out = append(out, m.sorted[i:]...)
	clear(m.sorted) // the spare buffer must not keep proxies alive
	m.spare, m.sorted = m.sorted[:0], out
}

// count adds (d = 1) or removes (d = -1) p from the per-owner figures.
func (m *mirror) count(p *proxy.Proxy, d int) {
	m.dirty[p.Owner] = true
	if m.owned[p.Owner] += d; m.owned[p.Owner] == 0 {
		delete(m.owned, p.Owner)
	}
	if p.Owner != "" {
		return
	}
	if d > 0 {
		m.unowned[p.ID] = struct{}{}
	} else {
		delete(m.unowned, p.ID)
	}
}

// changed reports whether owner's proxies (any owner's when all) changed
// since clean.
func (m *mirror) changed(owner string, all bool) bool {
	return m.all || m.dirty[owner] || all && len(m.dirty) > 0
}

func (m *mirror) clean() {
	clear(m.dirty)
	m.all = false
}

// output is the proxy list last built for one worker, reused while
// nothing it depends on changed.
type output struct {
	proxies []proxy.Proxy
	valid   bool
	builtAt time.Time
	// until is the earliest UsableUntil among proxies: from then on one of
	// them is no longer usable. Zero when proxies is empty.
	until time.Time
	exGen uint64
}

// stale reports whether the output must be rebuilt at now.
func (o *output) stale(now time.Time, exGen uint64) bool {
	return !o.valid || o.exGen != exGen || now.Before(o.builtAt) || !o.until.IsZero() && !now.Before(o.until)
}

// build lists, in ID order, the usable and not excluded proxies of owner
// (of every owner when all), at most max; nil when there are none. It
// replaces owner's previous list: the mirror points into the new one.
func (m *mirror) build(owner string, all bool, now time.Time, excluded map[proxy.ID]bool, exGen uint64, max int) output {
	o := output{valid: true, builtAt: now, exGen: exGen}
	n := len(m.sorted)
	if !all {
		n = m.owned[owner]
	}
	// Exactly n: out never grows, so pointers into it stay valid.
	out := make([]proxy.Proxy, 0, min(n, max))
	for i := range m.sorted {
		s := &m.sorted[i]
		p := s.p
		if !all && p.Owner != owner {
			continue
		}
		if len(out) == cap(out) || excluded[p.ID] || !p.Usable(now) {
			if s.inOut { // it may point into the list being replaced
				c := *p
				s.p, s.inOut = &c, false
			}
			continue
		}
		out = append(out, *p)
		s.p, s.inOut = &out[len(out)-1], true
		if o.until.IsZero() || p.UsableUntil.Before(o.until) {
			o.until = p.UsableUntil
		}
	}
	if len(out) > 0 {
		o.proxies = out
	}
	return o
}

// freeIDs returns the unowned, usable, not excluded proxies, sorted.
func (m *mirror) freeIDs(now time.Time, excluded map[proxy.ID]bool) []proxy.ID {
	var out []proxy.ID
	for id := range m.unowned {
		if !excluded[id] {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.DeleteFunc(out, func(id proxy.ID) bool {
		i, ok := slices.BinarySearchFunc(m.sorted, id, func(s slot, id proxy.ID) int { return cmp.Compare(s.p.ID, id) })
		return !ok || !m.sorted[i].p.Usable(now)
	})
}
