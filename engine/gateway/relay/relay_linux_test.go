package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fdCount counts this process's descriptors, and the pipe ends among them.
func fdCount(t testing.TB) (total, pipes int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the directory's own descriptor, closed meanwhile
		}
		total++
		if strings.HasPrefix(target, "pipe:") {
			pipes++
		}
	}
	return total, pipes
}

// roundTrip sends one byte each way through tn and waits for it.
func roundTrip(t testing.TB, tn *tunnel) {
	t.Helper()
	b := []byte{1}
	for _, p := range [][2]io.ReadWriter{{tn.client, tn.server}, {tn.server, tn.client}} {
		if _, err := p[0].Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p[1], b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIdleTunnelHoldsTwoDescriptors is issue 8's budget: after traffic, an
// idle relayed tunnel holds its two sockets and no pipe.
func TestIdleTunnelHoldsTwoDescriptors(t *testing.T) {
	const n = 300
	l := newLn(t)
	pool := NewPool(Options{Splice: true, Pipes: 8})
	total0, pipes0 := fdCount(t)
	tns := make([]*tunnel, n)
	for i := range tns {
		tns[i] = l.open(t, pool, bothTCP)
		roundTrip(t, tns[i])
	}
	// Every burst has ended once its byte arrived, but a relay returns
	// its pipe only after one more empty splice: wait for that.
	deadline := time.Now().Add(waitBound)
	for st := pool.Stats(); st.Idle != st.Live; st = pool.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("pipes not returned to the pool: %+v", st)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	total, pipes := fdCount(t)
	st := pool.Stats()
	if st.Live < 1 || st.Live > 8 {
		t.Errorf("pool %+v: want between 1 and 8 pipes open", st)
	}
	// The test's own client and server ends are two more per tunnel.
	if got, want := total-total0, n*(2+2)+2*st.Live; got != want {
		t.Errorf("%d idle tunnels hold %d descriptors; want %d (2 relay sockets + 2 test ends each, + %d pooled pipes)", n, got, want, st.Live)
	}
	if got := pipes - pipes0; got != 2*st.Live {
		t.Errorf("%d pipe ends open; want only the pool's %d", got, 2*st.Live)
	}
	for _, tn := range tns {
		_ = tn.client.CloseWrite()
		_ = tn.server.CloseWrite()
	}
	for _, tn := range tns {
		if r := tn.wait(t); r.err != nil || r.up != 1 || r.down != 1 {
			t.Fatalf("Copy = %+v", r)
		}
	}
	assertPoolSettled(t, pool, 0)
}

// queued is the bytes waiting in one of c's kernel queues (SIOCINQ: the
// receive queue; SIOCOUTQ: sent and not yet acknowledged).
func queued(t testing.TB, c *net.TCPConn, req uint) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), req) }); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// stall writes client → server while the server reads nothing, until
// the relay holds a pipe and data waits on both sides of it: the relay is
// then all but surely parked waiting for room in the destination (the
// assertions that follow hold wherever it is). written reports what the
// writer's Writes had accepted once they fail.
func stall(t *testing.T, tn *tunnel, pool *Pool) (written chan int64) {
	t.Helper()
	var total atomic.Int64
	written = make(chan int64, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			k, err := tn.client.Write(buf)
			total.Add(int64(k))
			if err != nil {
				written <- total.Load()
				return
			}
		}
	}()
	deadline := time.Now().Add(waitBound)
	for {
		st := pool.Stats()
		if st.Live-st.Idle == 1 && queued(t, tn.gwClient, unix.SIOCINQ) > 0 &&
			queued(t, tn.gwUp, unix.SIOCOUTQ) > 0 && queued(t, tn.server, unix.SIOCINQ) > 0 {
			return written
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tunnel never stalled: pool %+v", st)
		}
		time.Sleep(time.Millisecond) // polling with a deadline, not synchronising
	}
}

// TestWriteFailureDiscardsPipe: when writing to the destination fails
// with bytes in the pipe, the pipe is closed, never pooled, and both
// connections are torn down.
func TestWriteFailureDiscardsPipe(t *testing.T) {
	l := newLn(t)
	pool := NewPool(Options{Splice: true, Pipes: 2}) // one per direction: the burst always gets one
	tn := l.open(t, pool, bothTCP)
	roundTrip(t, tn)
	// The relay's upstream socket can no longer send: the next burst is
	// spliced into the pipe and fails (EPIPE) on the way out.
	if err := tn.gwUp.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.client.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	r := tn.wait(t)
	if !errors.Is(r.err, syscall.EPIPE) {
		t.Errorf("Copy error = %v; want EPIPE", r.err)
	}
	if err := readToEnd(t, tn.client); err != nil {
		t.Errorf("client end: %v", err)
	}
	assertPoolSettled(t, pool, 1)
}

func TestCloseOrDeadlineUnblocks(t *testing.T) {
	l := newLn(t)
	// What the gateway's shutdown does: close both relay ends.
	closeBoth := func(tn *tunnel) {
		_ = tn.gwClient.Close()
		_ = tn.gwUp.Close()
	}
	cases := []struct {
		name    string
		stalled bool
		mode    wrapMode
		stop    func(*tunnel)
		want    error // nil: any error
	}{
		{"idle, close", false, bothTCP, closeBoth, nil},
		{"idle, buffers, close", false, bothWrapped, closeBoth, nil},
		{"destination full, close", true, bothTCP, closeBoth, nil},
		{"destination full, buffers, close", true, upWrapped, closeBoth, nil},
		{"idle, read deadline", false, bothTCP,
			func(tn *tunnel) { _ = tn.gwClient.SetReadDeadline(time.Now()) }, os.ErrDeadlineExceeded},
		{"destination full, write deadline", true, bothTCP,
			func(tn *tunnel) { _ = tn.gwUp.SetWriteDeadline(time.Now()) }, os.ErrDeadlineExceeded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := NewPool(Options{Splice: true, Pipes: 1})
			tn := l.open(t, pool, c.mode)
			if c.stalled && c.mode == bothTCP {
				stall(t, tn, pool)
			}
			if c.stalled && c.mode != bothTCP {
				stallBuffered(t, tn)
			}
			c.stop(tn)
			r := tn.wait(t)
			if r.err == nil || c.want != nil && !errors.Is(r.err, c.want) {
				t.Errorf("Copy error = %v; want %v", r.err, c.want)
			}
			if err := readToEnd(t, tn.server); err != nil {
				t.Errorf("server end: %v", err)
			}
			// A pipe holding data when the copy was stopped is discarded.
			if st := pool.Stats(); st.Discarded > 1 || st.Live != st.Idle {
				t.Errorf("pool %+v", st)
			}
			checkPooledPipes(t, pool)
		})
	}
}

// stallBuffered fills a tunnel whose copy goes through buffers until its
// server end has data it does not read and the relay's client socket has
// more waiting.
func stallBuffered(t *testing.T, tn *tunnel) {
	t.Helper()
	go func() {
		buf := make([]byte, 16<<10)
		for {
			if _, err := tn.client.Write(buf); err != nil {
				return
			}
		}
	}()
	deadline := time.Now().Add(waitBound)
	for queued(t, tn.gwClient, unix.SIOCINQ) == 0 || queued(t, tn.server, unix.SIOCINQ) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the tunnel never stalled")
		}
		time.Sleep(time.Millisecond) // polling with a deadline, not synchronising
	}
}

// TestStalledDestinationResumes: a tunnel parked on a full destination
// delivers every byte once the destination reads again.
func TestStalledDestinationResumes(t *testing.T) {
	l := newLn(t)
	pool := NewPool(Options{Splice: true, Pipes: 1})
	tn := l.open(t, pool, bothTCP)
	written := stall(t, tn, pool)
	// Close ends the writer's blocked Write; what the kernel had taken is
	// still sent.
	_ = tn.client.Close()
	n := <-written
	m, _, err := drain(tn.server)
	if err != nil || m != n {
		t.Errorf("delivered %d of %d written (%v)", m, n, err)
	}
	_ = tn.server.Close()
	if r := tn.wait(t); r.up != n {
		t.Errorf("Copy = %+v; want %d up", r, n)
	}
	assertPoolSettled(t, pool, 0)
}

// TestExhaustedPoolFallsBackToBuffers: with every pipe taken, a burst is
// copied through a buffer at once rather than waiting for a pipe.
func TestExhaustedPoolFallsBackToBuffers(t *testing.T) {
	l := newLn(t)
	pool := NewPool(Options{Splice: true, Pipes: 1})
	held := pool.get() // as a tunnel parked on a full destination holds it
	if held == nil {
		t.Fatal("no pipe")
	}
	tn := l.open(t, pool, bothTCP)
	got := make(chan [32]byte, 1)
	go func() {
		_, s, err := drain(tn.server)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	sum, err := stream(tn.client, 3<<20, 7)
	if err != nil {
		t.Fatal(err)
	}
	if <-got != sum {
		t.Fatal("bytes through the fallback differ")
	}
	if st := pool.Stats(); st.Fallbacks == 0 || st.Created != 1 {
		t.Errorf("pool %+v: want fallbacks and the one pipe", st)
	}
	// Once the pipe is back, bursts splice again.
	pool.put(held)
	fallbacks := pool.Stats().Fallbacks
	b := make([]byte, 4)
	if _, err := tn.server.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(tn.client, b); err != nil {
		t.Fatal(err)
	}
	_ = tn.server.CloseWrite()
	if r := tn.wait(t); r.err != nil || r.up != 3<<20 || r.down != 4 {
		t.Errorf("Copy = %+v", r)
	}
	if st := pool.Stats(); st.Fallbacks != fallbacks {
		t.Errorf("pool %+v: a burst fell back with a pipe free", st)
	}
	assertPoolSettled(t, pool, 0)
}

// checkPooledPipes fails if a pipe waiting in the pool holds a byte.
func checkPooledPipes(t *testing.T, pool *Pool) {
	t.Helper()
	for range len(pool.pipes.idle) {
		pp := <-pool.pipes.idle
		n, err := unix.IoctlGetInt(pp.r, unix.TIOCINQ)
		pool.pipes.idle <- pp
		if err != nil || n != 0 || pp.data != 0 {
			t.Errorf("a pooled pipe holds %d bytes (%v)", n, err)
		}
	}
}
