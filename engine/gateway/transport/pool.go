package transport

import (
	"hash/maphash"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
)

// poolKey names one idle pool: an upstream proxy (address and the
// credentials we present to it), or a destination reached directly.
type poolKey struct {
	addr, auth string
	direct     bool
}

// pconn is one kept-alive upstream connection. Its read buffer is held
// only while a request uses it.
type pconn struct {
	conn   net.Conn
	br     h1.Reader
	hp     *hostPool
	idleAt time.Time
	reused bool
	// The body writer of the exchange in progress: its end is reported
	// on wdone (made once, on the first request with a body); stopping
	// tells it that an error it meets is the exchange ending.
	wdone    chan error
	stopping atomic.Bool
}

func (pc *pconn) close() {
	pc.br.Release()
	_ = pc.conn.Close()
}

// hostPool is the idle stack of one key: last in, first out, so the
// connections kept warm are the most recently used and the rest expire.
type hostPool struct {
	mu       sync.Mutex
	idle     []*pconn
	lastUsed time.Time
	dead     bool // dropped from the map by a sweep: puts close instead
}

const poolShards = 32

// pools holds the idle pools in sharded maps: a lookup takes one shard's
// read lock, never a lock shared by every request.
type pools struct {
	seed   maphash.Seed
	shards [poolShards]struct {
		mu sync.RWMutex
		m  map[poolKey]*hostPool
		_  [32]byte
	}
	idle  atomic.Int64 // idle connections in all pools
	armed atomic.Bool  // a sweep is scheduled
}

func (ps *pools) init() {
	ps.seed = maphash.MakeSeed()
	for i := range ps.shards {
		ps.shards[i].m = make(map[poolKey]*hostPool)
	}
}

func (ps *pools) get(k poolKey) *hostPool {
	sh := &ps.shards[maphash.String(ps.seed, k.addr)%poolShards]
	sh.mu.RLock()
	hp := sh.m[k]
	sh.mu.RUnlock()
	if hp != nil {
		return hp
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if hp = sh.m[k]; hp == nil {
		hp = &hostPool{}
		sh.m[k] = hp
	}
	return hp
}

// take pops the most recent idle connection younger than maxIdle; older
// ones (everything below an expired one is older still) are closed.
func (t *Transport) take(hp *hostPool, now time.Time) *pconn {
	hp.mu.Lock()
	defer hp.mu.Unlock()
	hp.lastUsed = now
	for n := len(hp.idle); n > 0; n-- {
		pc := hp.idle[n-1]
		hp.idle[n-1] = nil
		hp.idle = hp.idle[:n-1]
		t.pools.idle.Add(-1)
		if idle := now.Sub(pc.idleAt); idle < t.opts.IdleConnTimeout && (idle < staleProbeAfter || alive(pc.conn)) {
			pc.reused = true
			return pc
		}
		pc.close()
	}
	return nil
}

// staleProbeAfter is the idle time after which a kept connection is probed
// before use: upstreams close idle connections on their own schedule, and
// a request with a body sent into a closed one could not be replayed. It
// is zero — every reuse is probed, one non-blocking peek — because a
// connection may also hold bytes the upstream sent after its last
// response (a sloppy proxy relaying a target's extra answer): without the
// probe they would be read as the next client's response.
var staleProbeAfter time.Duration

// put keeps pc idle within the bounds, or closes it.
func (t *Transport) put(pc *pconn) {
	pc.br.Release()
	now := time.Now()
	hp := pc.hp
	hp.mu.Lock()
	if hp.dead || t.closed.Load() || len(hp.idle) >= t.opts.MaxIdleConnsPerProxy ||
		t.pools.idle.Load() >= int64(t.opts.MaxIdleConns) {
		hp.mu.Unlock()
		_ = pc.conn.Close()
		return
	}
	pc.idleAt, hp.lastUsed = now, now
	hp.idle = append(hp.idle, pc)
	t.pools.idle.Add(1)
	hp.mu.Unlock()
	if t.pools.armed.CompareAndSwap(false, true) {
		time.AfterFunc(t.sweepEvery(), t.sweep)
	}
}

func (t *Transport) sweepEvery() time.Duration {
	return max(t.opts.IdleConnTimeout/2, time.Second)
}

// sweep closes expired idle connections and forgets pools unused for an
// idle timeout; it reschedules itself while any pool remains.
func (t *Transport) sweep() {
	now := time.Now()
	remain := false
	for i := range t.pools.shards {
		sh := &t.pools.shards[i]
		sh.mu.Lock()
		for k, hp := range sh.m {
			hp.mu.Lock()
			keep := 0
			for _, pc := range hp.idle {
				if now.Sub(pc.idleAt) < t.opts.IdleConnTimeout && !t.closed.Load() {
					hp.idle[keep] = pc
					keep++
					continue
				}
				t.pools.idle.Add(-1)
				_ = pc.conn.Close()
			}
			clear(hp.idle[keep:])
			hp.idle = hp.idle[:keep]
			if keep == 0 && now.Sub(hp.lastUsed) >= t.opts.IdleConnTimeout {
				hp.dead = true
				delete(sh.m, k)
			}
			hp.mu.Unlock()
		}
		remain = remain || len(sh.m) > 0
		sh.mu.Unlock()
	}
	t.pools.armed.Store(false)
	if remain && !t.closed.Load() && t.pools.armed.CompareAndSwap(false, true) {
		time.AfterFunc(t.sweepEvery(), t.sweep)
	}
}

// CloseIdleConnections closes every idle upstream connection; connections
// in use finish their request and are kept again afterwards.
func (t *Transport) CloseIdleConnections() {
	for i := range t.pools.shards {
		sh := &t.pools.shards[i]
		sh.mu.RLock()
		for _, hp := range sh.m {
			hp.mu.Lock()
			for _, pc := range hp.idle {
				t.pools.idle.Add(-1)
				_ = pc.conn.Close()
			}
			clear(hp.idle)
			hp.idle = hp.idle[:0]
			hp.mu.Unlock()
		}
		sh.mu.RUnlock()
	}
}

// Close closes the idle connections and keeps none from now on (reload,
// shutdown): connections still in use close when their request ends.
func (t *Transport) Close() {
	t.closed.Store(true)
	t.CloseIdleConnections()
}

// IdleConns is the number of idle upstream connections kept.
func (t *Transport) IdleConns() int64 { return t.pools.idle.Load() }
