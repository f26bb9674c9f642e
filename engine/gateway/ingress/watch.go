package ingress

import (
	"sync"
	"syscall"
	"time"
)

// The client watch. While a forwarded request waits — parked by
// onUnavailable "wait", or for the upstream's response head — nothing
// reads the client connection, so a client that leaves would go unnoticed
// until waitTimeout or responseHeaderTimeout, holding its maxConns slot and
// the proxy's. net/http keeps a background read running for every
// request; here a wait that lasts longer than watchGrace gets a watcher, a
// goroutine that parks until the client connection turns readable and
// then peeks at it (MSG_PEEK: nothing is consumed). End of stream (a
// client that closed or half-closed, as net/http counts it) or an error (a
// reset) means the client left: the connection's context is canceled,
// which ends a parked Acquire or a dial, the upstream exchange is aborted
// and the client connection closed, which frees its slots at once. A byte
// means the client sent more (a pipelined request): the watcher stops and
// the byte stays for the connection's reader. An exchange that sends a
// request body is not watched: the transport reads the body from the
// client, and a client that leaves fails that read.

// watchGrace is how long a wait runs unwatched: a request answered sooner
// costs a timer reset and stop, no goroutine and no allocation.
const watchGrace = 500 * time.Millisecond

// abortRepeat is how often a watcher that found the client gone aborts the
// upstream exchange again until the wait ends: the exchange may not have
// published its upstream connection yet when the first abort comes (a
// connection just taken from the pool or dialled).
const abortRepeat = 50 * time.Millisecond

// States of a watcher, under watcher.mu.
const (
	watchArmed    uint8 = iota // the timer is set
	watchCanceled              // the wait ended after the timer fired, before the watcher started
	watchRunning               // the watcher waits on the connection
	watchEnded                 // the watcher has ended (or is about to send on done)
)

// watcher is the client watch of one connection. The timer, the channels
// and the raw connection are made once per connection, on the first wait
// that needs them.
type watcher struct {
	mu    sync.Mutex
	state uint8

	armed bool        // the connection's goroutine set the timer (its own)
	timer *time.Timer // runs watchRun after watchGrace
	done  chan struct{}
	stop  chan struct{} // the wait ended while the watcher ran

	// The watcher's own, handed over with done.
	left   bool // the client was found gone
	rc     syscall.RawConn
	peekFn func(fd uintptr) bool
	peeked uint8
	buf    [1]byte
}

// watchClient starts the watch for the wait that follows, in which
// nothing else reads the client connection; unwatchClient must end it
// before the connection is read or written again.
func (c *conn) watchClient() {
	if !canWatch {
		return
	}
	w := &c.watch
	w.mu.Lock()
	w.state = watchArmed
	w.mu.Unlock()
	w.armed = true
	if w.timer == nil {
		w.done = make(chan struct{}, 1)
		w.stop = make(chan struct{}, 1)
		w.timer = time.AfterFunc(watchGrace, c.watchRun)
		return
	}
	w.timer.Reset(watchGrace)
}

// unwatchClient ends the watch and reports whether the client left
// meanwhile. When it returns no watcher runs, nothing was consumed and the
// connection has no read deadline.
func (c *conn) unwatchClient() bool {
	w := &c.watch
	if !w.armed {
		return false
	}
	w.armed = false
	if w.timer.Stop() {
		return false // within the grace: no watcher
	}
	w.mu.Lock()
	st := w.state
	switch st {
	case watchArmed:
		w.state = watchCanceled
	case watchRunning:
		// Wakes a watcher parked on the connection, or ends the aborts of
		// one that found the client gone.
		_ = c.raw.SetReadDeadline(aLongTimeAgo)
		w.stop <- struct{}{} // one send per run, into a buffer of one
	}
	w.mu.Unlock()
	<-w.done
	if st == watchRunning {
		_ = c.raw.SetReadDeadline(time.Time{})
	}
	return w.left
}

// watchRun is the watcher: the timer's function, in its own goroutine.
func (c *conn) watchRun() {
	w := &c.watch
	w.mu.Lock()
	if w.state != watchArmed {
		w.state = watchEnded
		w.left = false
		w.mu.Unlock()
		w.done <- struct{}{}
		return
	}
	w.state = watchRunning
	// The head's deadline is no bound on a wait. Cleared under mu, so
	// that the past deadline of unwatchClient comes after it.
	_ = c.raw.SetReadDeadline(time.Time{})
	w.mu.Unlock()
	w.left = c.peekGone()
	if w.left {
		c.leave()
	}
	w.mu.Lock()
	w.state = watchEnded
	select {
	case <-w.stop:
	default:
	}
	w.mu.Unlock()
	w.done <- struct{}{}
}

// leave ends the request of a client that left: its context is canceled,
// its connection closed (its listener slots given back) and the upstream
// exchange aborted, again every abortRepeat until the wait ends.
func (c *conn) leave() {
	if c.cancel != nil {
		c.cancel()
	}
	_ = c.nc.Close()
	t := time.NewTimer(abortRepeat)
	defer t.Stop()
	for {
		c.resp.Abort()
		select {
		case <-c.watch.stop:
			return
		case <-t.C:
			t.Reset(abortRepeat)
		}
	}
}

// aLongTimeAgo is a deadline in the past: it wakes a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// What a peek found.
const (
	peekNothing uint8 = iota
	peekData
	peekGone
)
