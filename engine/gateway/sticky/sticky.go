package sticky

import (
	"hash/maphash"
	"sync"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// MaxShards bounds the shards of one cache; smaller caches use fewer so
// that the bound stays exact.
const MaxShards = 16

// MaxSessionLen is the longest session id kept; a longer one is ignored
// (the request is served without stickiness), so a client cannot make the
// cache hold large keys.
const MaxSessionLen = 128

type key struct {
	client, session string
}

type node struct {
	k          key
	id         proxy.ID
	until      int64 // unix nanoseconds, exclusive
	prev, next int32
}

type shard struct {
	mu    sync.Mutex
	m     map[key]int32
	nodes []node
	// head is the most recently used node, tail the least; free chains
	// unused nodes through next.
	head, tail, free int32
	_                [40]byte // keep neighbouring shards' mutexes apart
}

// Cache is a bounded LRU of session bindings.
type Cache struct {
	seed   maphash.Seed
	max    int
	shards []shard
}

// New returns a cache holding at most maxEntries bindings (at least 1).
func New(maxEntries int) *Cache {
	maxEntries = max(maxEntries, 1)
	n := min(MaxShards, maxEntries)
	c := &Cache{seed: maphash.MakeSeed(), max: maxEntries, shards: make([]shard, n)}
	for i := range c.shards {
		size := maxEntries / n
		if i < maxEntries%n {
			size++
		}
		s := &c.shards[i]
		s.m = make(map[key]int32, size)
		s.nodes = make([]node, size)
		s.head, s.tail, s.free = -1, -1, 0
		for j := range s.nodes {
			s.nodes[j].next = int32(j + 1)
		}
		s.nodes[size-1].next = -1
	}
	return c
}

// Max is the bound on bindings.
func (c *Cache) Max() int { return c.max }

func (c *Cache) shard(k key) *shard {
	if len(c.shards) == 1 {
		return &c.shards[0]
	}
	h := maphash.String(c.seed, k.session) ^ maphash.String(c.seed, k.client)*0x9e3779b97f4a7c15
	return &c.shards[h%uint64(len(c.shards))]
}

// Get returns the proxy bound to (client, session) if the binding is still
// inside its proxy's usable period at now (unix nanoseconds); an expired
// binding is removed.
func (c *Cache) Get(client, session string, now int64) (proxy.ID, bool) {
	k := key{client, session}
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.m[k]
	if !ok {
		return "", false
	}
	n := &s.nodes[i]
	if now >= n.until {
		s.remove(k, i)
		return "", false
	}
	s.touch(i)
	return n.id, true
}

// Put binds (client, session) to id until the given instant (the proxy's
// usable_until), evicting the least recently used binding of the shard when
// it is full. A binding that is already expired is not stored.
func (c *Cache) Put(client, session string, id proxy.ID, until, now int64) {
	if session == "" || len(session) > MaxSessionLen || now >= until {
		return
	}
	k := key{client, session}
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.m[k]; ok {
		n := &s.nodes[i]
		n.id, n.until = id, until
		s.touch(i)
		return
	}
	if s.free < 0 {
		s.remove(s.nodes[s.tail].k, s.tail)
	}
	i := s.free
	n := &s.nodes[i]
	s.free = n.next
	*n = node{k: k, id: id, until: until, prev: -1, next: s.head}
	if s.head >= 0 {
		s.nodes[s.head].prev = i
	}
	s.head = i
	if s.tail < 0 {
		s.tail = i
	}
	s.m[k] = i
}

// Delete removes the binding of (client, session) if it still points at id:
// a failure on an old proxy must not undo a newer binding.
func (c *Cache) Delete(client, session string, id proxy.ID) {
	k := key{client, session}
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.m[k]; ok && s.nodes[i].id == id {
		s.remove(k, i)
	}
}

// Len is the number of bindings held (expired ones included until they
// are looked up or evicted).
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

func (s *shard) unlink(i int32) {
	n := &s.nodes[i]
	if n.prev >= 0 {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next >= 0 {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
}

func (s *shard) touch(i int32) {
	if s.head == i {
		return
	}
	s.unlink(i)
	n := &s.nodes[i]
	n.prev, n.next = -1, s.head
	s.nodes[s.head].prev = i
	s.head = i
}

func (s *shard) remove(k key, i int32) {
	s.unlink(i)
	delete(s.m, k)
	s.nodes[i] = node{next: s.free}
	s.free = i
}
