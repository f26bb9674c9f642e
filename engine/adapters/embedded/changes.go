package embedded

import (
	"context"
	"fmt"
	"slices"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// changeLog is a ring of the IDs of the last max entry changes: version s
// (the s-th change) is at ids[(s-1) % max]. Only the pool's lock guards it.
type changeLog struct {
	max int
	seq uint64 // the current version: changes recorded so far
	ids []proxy.ID
}

func (c *changeLog) record(id proxy.ID) {
	c.seq++
	if len(c.ids) < c.max {
		c.ids = append(c.ids, id)
		return
	}
	c.ids[(c.seq-1)%uint64(c.max)] = id
}

// since returns the distinct IDs changed after version v, sorted; false
// when the ring no longer holds them all or v is not a version yet.
func (c *changeLog) since(v uint64) ([]proxy.ID, bool) {
	if v > c.seq || c.seq-v > uint64(len(c.ids)) {
		return nil, false
	}
	out := make([]proxy.ID, 0, c.seq-v)
	for s := v + 1; s <= c.seq; s++ {
		out = append(out, c.ids[(s-1)%uint64(c.max)])
	}
	slices.Sort(out)
	return slices.Compact(out), true
}

// Changes implements activitypool.ChangeFeed in O(k log k) for k changes
// since the version, at most MaxChangeLog; further behind it answers
// Reset. Versions count entry changes from 0 at NewPool; Changed copies
// are the entries' current state (a proxy changed twice is reported once).
func (p *Pool) Changes(ctx context.Context, since uint64, states []proxy.State) (activitypool.Changes, error) {
	if err := ctx.Err(); err != nil {
		return activitypool.Changes{}, fmt.Errorf("read pool changes: %w", err)
	}
	var want [numStates]bool
	for _, s := range states {
		if int(s) < numStates {
			want[s] = true
		}
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := activitypool.Changes{Version: p.changes.seq}
	ids, ok := p.changes.since(since)
	if !ok {
		out.Reset = true
		return out, nil
	}
	for _, id := range ids {
		if e := p.byID[id]; e != nil && (len(states) == 0 || want[e.p.State]) {
			out.Changed = append(out.Changed, copyProxy(&e.p))
		} else {
			out.Gone = append(out.Gone, id)
		}
	}
	return out, nil
}

var _ activitypool.ChangeFeed = (*Pool)(nil)
