package embedded

import (
	"math"
	"time"
)

// The pool keeps its ordered indexes as treaps threaded through the entries
// themselves: an entry carries one link per index, so the indexes cost no
// allocation beyond the entry and an entry can sit in several at once. Each
// node is augmented with its subtree's size, members with a slot and
// MaxConcurrency sum, which makes Inventory and FreeCapacity a walk down
// one path instead of a scan of the upstream.

// linkID names one index an entry can be threaded into.
type linkID uint8

const (
	// linkUpAvail: AVAILABLE entries of one upstream, owned or not, by
	// UsableUntil. Inventory and reserveForGateway count it.
	linkUpAvail linkID = iota
	// linkUpOwner: AVAILABLE entries of one upstream and one owner, by
	// UsableUntil. An entry has one owner at a time, so one link serves
	// the upstream's unowned index (upstreamIndex.free, which extraction
	// with an upstream filter walks) and each owner's (FreeCapacity).
	linkUpOwner
	// linkFree: AVAILABLE unowned entries of all upstreams, by UsableUntil.
	// Extraction without an upstream filter walks it.
	linkFree
	// linkExpiry: every entry by ExpiresAt, for Sweep.
	linkExpiry
	numLinks
)

// link holds copies of everything a tree walk reads (key, tie-break,
// priority) so visiting a node touches one small block of the entry: on a
// million-entry pool the walks are bound by cache misses, not compares.
type link struct {
	left, right *entry
	key         int64  // UnixNano of the ordering time
	seq         uint64 // the entry's admission sequence, the tie-break
	slots       int64
	size        int32
	live        int32 // members with slots > 0
	prio        uint32
	member      bool
}

// tree is one ordered index: by key, then by admission sequence, both
// ascending.
type tree struct {
	root *entry
	id   linkID
}

func (t *tree) less(a, b *entry) bool {
	la, lb := &a.links[t.id], &b.links[t.id]
	if la.key != lb.key {
		return la.key < lb.key
	}
	return la.seq < lb.seq
}

func (t *tree) size(n *entry) int32 {
	if n == nil {
		return 0
	}
	return n.links[t.id].size
}

func (t *tree) live(n *entry) int32 {
	if n == nil {
		return 0
	}
	return n.links[t.id].live
}

func (t *tree) sum(n *entry) int64 {
	if n == nil {
		return 0
	}
	return n.links[t.id].slots
}

func (t *tree) pull(n *entry) {
	l := &n.links[t.id]
	l.size = 1 + t.size(l.left) + t.size(l.right)
	l.live = t.live(l.left) + t.live(l.right)
	if n.slots > 0 {
		l.live++
	}
	l.slots = n.slots + t.sum(l.left) + t.sum(l.right)
}

func (t *tree) len() int { return int(t.size(t.root)) }

// insert threads e into the tree under key; a second insert is a no-op so
// index bookkeeping mistakes cannot corrupt the shape.
func (t *tree) insert(e *entry, key int64) {
	l := &e.links[t.id]
	if l.member {
		return
	}
	*l = link{key: key, seq: e.seq, prio: e.prio, member: true}
	t.root = t.ins(t.root, e)
}

func (t *tree) ins(n, e *entry) *entry {
	if n == nil {
		t.pull(e)
		return e
	}
	l := &n.links[t.id]
	if t.less(e, n) {
		l.left = t.ins(l.left, e)
		if l.left.links[t.id].prio > l.prio {
			return t.rotateRight(n)
		}
	} else {
		l.right = t.ins(l.right, e)
		if l.right.links[t.id].prio > l.prio {
			return t.rotateLeft(n)
		}
	}
	t.pull(n)
	return n
}

func (t *tree) rotateRight(n *entry) *entry {
	l := n.links[t.id].left
	n.links[t.id].left = l.links[t.id].right
	l.links[t.id].right = n
	t.pull(n)
	t.pull(l)
	return l
}

func (t *tree) rotateLeft(n *entry) *entry {
	r := n.links[t.id].right
	n.links[t.id].right = r.links[t.id].left
	r.links[t.id].left = n
	t.pull(n)
	t.pull(r)
	return r
}

// remove unthreads e; removing a non-member is a no-op.
func (t *tree) remove(e *entry) {
	if !e.links[t.id].member {
		return
	}
	t.root = t.del(t.root, e)
	e.links[t.id] = link{}
}

func (t *tree) del(n, e *entry) *entry {
	if n == nil {
		return nil
	}
	if n == e {
		l := &n.links[t.id]
		return t.merge(l.left, l.right)
	}
	l := &n.links[t.id]
	if t.less(e, n) {
		l.left = t.del(l.left, e)
	} else {
		l.right = t.del(l.right, e)
	}
	t.pull(n)
	return n
}

// merge joins two treaps where every key of a is below every key of b.
func (t *tree) merge(a, b *entry) *entry {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.links[t.id].prio > b.links[t.id].prio:
		a.links[t.id].right = t.merge(a.links[t.id].right, b)
		t.pull(a)
		return a
	default:
		b.links[t.id].left = t.merge(a, b.links[t.id].left)
		t.pull(b)
		return b
	}
}

// countAbove returns how many members have key > floor, how many of those
// have slots (live) and the sum of their slots, in O(height).
func (t *tree) countAbove(floor int64) (n, live int, slots int64) {
	for c := t.root; c != nil; {
		l := &c.links[t.id]
		if l.key > floor {
			n += 1 + int(t.size(l.right))
			live += int(t.live(l.right))
			if c.slots > 0 {
				live++
			}
			slots += c.slots + t.sum(l.right)
			c = l.left
		} else {
			c = l.right
		}
	}
	return n, live, slots
}

// descendAbove visits members with key > floor from the largest key down,
// until fn returns false. fn must not modify the tree.
func (t *tree) descendAbove(floor int64, fn func(*entry) bool) {
	t.desc(t.root, floor, fn)
}

func (t *tree) desc(n *entry, floor int64, fn func(*entry) bool) bool {
	if n == nil {
		return true
	}
	l := &n.links[t.id]
	if !t.desc(l.right, floor, fn) {
		return false
	}
	// Everything after n in descending order is at most n's key.
	if l.key <= floor {
		return false
	}
	if !fn(n) {
		return false
	}
	return t.desc(l.left, floor, fn)
}

// ascendTo visits members with key <= ceil from the smallest key up, until
// fn returns false. fn must not modify the tree.
func (t *tree) ascendTo(ceil int64, fn func(*entry) bool) {
	t.asc(t.root, ceil, fn)
}

func (t *tree) asc(n *entry, ceil int64, fn func(*entry) bool) bool {
	if n == nil {
		return true
	}
	l := &n.links[t.id]
	if !t.asc(l.left, ceil, fn) {
		return false
	}
	if l.key > ceil {
		return false
	}
	if !fn(n) {
		return false
	}
	return t.asc(l.right, ceil, fn)
}

// nanos maps a time onto the int64 key space, clamping the instants
// UnixNano cannot represent so ordering stays monotonic.
func nanos(ts time.Time) int64 {
	switch y := ts.Year(); {
	case y < 1678:
		return math.MinInt64
	case y > 2261:
		return math.MaxInt64
	}
	return ts.UnixNano()
}
