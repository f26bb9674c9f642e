package relay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// waitBound bounds every wait of these tests; it only matters when a test
// is about to fail.
const waitBound = 30 * time.Second

// tunnel is one relayed pair over loopback: the test holds client and
// server, the relay copies between gwClient and gwUp.
type tunnel struct {
	client, server *net.TCPConn
	gwClient, gwUp *net.TCPConn
	done           chan result
}

type result struct {
	up, down int64
	err      error
}

// lnPair makes TCP pairs on one loopback listener.
type lnPair struct{ ln *net.TCPListener }

func newLn(t testing.TB) *lnPair {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &lnPair{ln: ln}
}

// pair returns the dialing and the accepted end of one connection.
func (l *lnPair) pair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	d, err := net.DialTCP("tcp", nil, l.ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	a, err := l.ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	return d, a
}

// wrapped hides *net.TCPConn's type (not its methods, CloseWrite among
// them), so the relay must take its buffer paths.
type wrapped struct{ *net.TCPConn }

type wrapMode int

const (
	bothTCP     wrapMode = iota
	upWrapped            // client end TCP, upstream end not: peek + buffer bursts one way, buffer copy the other
	bothWrapped          // buffer copies both ways
)

// open starts a relay between two fresh pairs.
func (l *lnPair) open(t testing.TB, pool *Pool, mode wrapMode) *tunnel {
	t.Helper()
	tn := &tunnel{done: make(chan result, 1)}
	tn.client, tn.gwClient = l.pair(t)
	tn.gwUp, tn.server = l.pair(t)
	// A broken relay fails a test at this bound rather than hanging it.
	for _, c := range []*net.TCPConn{tn.client, tn.server} {
		_ = c.SetDeadline(time.Now().Add(waitBound))
	}
	var c, u io.ReadWriteCloser = tn.gwClient, tn.gwUp
	switch mode {
	case upWrapped:
		u = wrapped{tn.gwUp}
	case bothWrapped:
		c, u = wrapped{tn.gwClient}, wrapped{tn.gwUp}
	}
	go func() {
		up, down, err := pool.Copy(c, u)
		tn.done <- result{up, down, err}
	}()
	t.Cleanup(tn.closeAll)
	return tn
}

func (tn *tunnel) closeAll() {
	for _, c := range []*net.TCPConn{tn.client, tn.server, tn.gwClient, tn.gwUp} {
		_ = c.Close()
	}
}

func (tn *tunnel) wait(t testing.TB) result {
	t.Helper()
	select {
	case r := <-tn.done:
		return r
	case <-time.After(waitBound):
		t.Fatal("relay did not return")
		return result{}
	}
}

// stream writes n random bytes to w, then half-closes it, and returns
// their digest.
func stream(w *net.TCPConn, n int, seed uint64) ([32]byte, error) {
	h := sha256.New()
	var key [32]byte
	key[0] = byte(seed)
	src, r := rand.NewChaCha8(key), rand.New(rand.NewPCG(seed, seed))
	buf := make([]byte, 64<<10)
	for n > 0 {
		k := min(n, 1+r.IntN(len(buf)))
		_, _ = src.Read(buf[:k])
		h.Write(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return [32]byte{}, err
		}
		n -= k
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, w.CloseWrite()
}

// drain reads r to EOF and returns the count and digest.
func drain(r io.Reader) (int64, [32]byte, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return n, sum, err
}

func TestCopyIntactBothWays(t *testing.T) {
	l := newLn(t)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 4 << 10, 1 << 20, rng.IntN(48 << 20), rng.IntN(16 << 20)}
	pools := []struct {
		name string
		pool func() *Pool
		mode wrapMode
	}{
		{"splice", func() *Pool { return NewPool(Options{Splice: true, Pipes: 4}) }, bothTCP},
		{"small pipes", func() *Pool { return NewPool(Options{Splice: true, Pipes: 4, PipeBytes: 4096}) }, bothTCP},
		{"buffers", func() *Pool { return NewPool(Options{}) }, bothTCP},
		{"one large buffer", func() *Pool { return NewPool(Options{LargeBuffers: 1}) }, bothTCP},
		{"small buffers only", func() *Pool { return NewPool(Options{LargeBuffers: -1}) }, bothTCP},
		{"splice with no pipes", func() *Pool { return NewPool(Options{Splice: true, Pipes: -1}) }, bothTCP},
		{"upstream not TCP", func() *Pool { return NewPool(Options{Splice: true, Pipes: 4}) }, upWrapped},
		{"neither TCP", func() *Pool { return NewPool(Options{Splice: true, Pipes: 4}) }, bothWrapped},
	}
	for _, pc := range pools {
		for i, up := range sizes {
			down := sizes[len(sizes)-1-i]
			t.Run(pc.name, func(t *testing.T) {
				pool := pc.pool()
				tn := l.open(t, pool, pc.mode)
				type got struct {
					n   int64
					sum [32]byte
					err error
				}
				atServer, atClient := make(chan got, 1), make(chan got, 1)
				go func() { n, s, err := drain(tn.server); atServer <- got{n, s, err} }()
				go func() { n, s, err := drain(tn.client); atClient <- got{n, s, err} }()
				sentUp := make(chan [32]byte, 1)
				go func() {
					s, err := stream(tn.client, up, uint64(i))
					if err != nil {
						t.Error(err)
					}
					sentUp <- s
				}()
				sumDown, err := stream(tn.server, down, uint64(i+100))
				if err != nil {
					t.Fatal(err)
				}
				sumUp := <-sentUp
				s, c := <-atServer, <-atClient
				if s.err != nil || s.n != int64(up) || s.sum != sumUp {
					t.Errorf("up: got %d bytes (err %v), want %d, digest match %v", s.n, s.err, up, s.sum == sumUp)
				}
				if c.err != nil || c.n != int64(down) || c.sum != sumDown {
					t.Errorf("down: got %d bytes (err %v), want %d, digest match %v", c.n, c.err, down, c.sum == sumDown)
				}
				r := tn.wait(t)
				if r.err != nil || r.up != int64(up) || r.down != int64(down) {
					t.Errorf("Copy = %d, %d, %v; want %d, %d, nil", r.up, r.down, r.err, up, down)
				}
				assertPoolSettled(t, pool, 0)
			})
		}
	}
}

// assertPoolSettled checks that every open pipe is back in the pool and
// that exactly discarded pipes were thrown away.
func assertPoolSettled(t *testing.T, pool *Pool, discarded uint64) {
	t.Helper()
	st := pool.Stats()
	if st.Live != st.Idle || int64(st.Live) > pool.pipes.max || st.Discarded != discarded {
		t.Errorf("pool %+v: want every open pipe idle, at most %d, %d discarded", st, pool.pipes.max, discarded)
	}
	if st.LargeLive != st.LargeIdle || int64(st.LargeLive) > pool.large.max {
		t.Errorf("pool %+v: want every large buffer idle, at most %d", st, pool.large.max)
	}
	checkPooledPipes(t, pool)
}

func TestHalfClosePropagates(t *testing.T) {
	l := newLn(t)
	for _, mode := range []wrapMode{bothTCP, upWrapped, bothWrapped} {
		for _, clientFirst := range []bool{true, false} {
			t.Run("", func(t *testing.T) {
				pool := NewPool(Options{Splice: true, Pipes: 2})
				tn := l.open(t, pool, mode)
				first, second := tn.client, tn.server
				if !clientFirst {
					first, second = second, first
				}
				// first says something and half-closes; second sees it,
				// then EOF, and can still answer.
				if _, err := first.Write([]byte("hello")); err != nil {
					t.Fatal(err)
				}
				if err := first.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				_ = second.SetReadDeadline(time.Now().Add(waitBound))
				b, err := io.ReadAll(second)
				if err != nil || string(b) != "hello" {
					t.Fatalf("second read %q, %v; want hello then EOF", b, err)
				}
				if _, err := second.Write([]byte("world!")); err != nil {
					t.Fatalf("answer after the half-close: %v", err)
				}
				if err := second.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				_ = first.SetReadDeadline(time.Now().Add(waitBound))
				b, err = io.ReadAll(first)
				if err != nil || string(b) != "world!" {
					t.Fatalf("first read %q, %v; want world! then EOF", b, err)
				}
				r := tn.wait(t)
				wantUp, wantDown := int64(5), int64(6)
				if !clientFirst {
					wantUp, wantDown = 6, 5
				}
				if r.err != nil || r.up != wantUp || r.down != wantDown {
					t.Errorf("Copy = %d, %d, %v; want %d, %d, nil", r.up, r.down, r.err, wantUp, wantDown)
				}
				assertPoolSettled(t, pool, 0)
			})
		}
	}
}

// reset closes c with an RST instead of a FIN.
func reset(t testing.TB, c *net.TCPConn) {
	t.Helper()
	if err := c.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
}

// readToEnd reads c until EOF or an error, with a bound.
func readToEnd(t testing.TB, c *net.TCPConn) error {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(waitBound))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, syscall.ECONNRESET) {
		err = nil // torn down by an RST is torn down
	}
	return err
}

func TestResetTearsDownBoth(t *testing.T) {
	l := newLn(t)
	for _, mode := range []wrapMode{bothTCP, upWrapped, bothWrapped} {
		for _, serverResets := range []bool{true, false} {
			t.Run("", func(t *testing.T) {
				pool := NewPool(Options{Splice: true, Pipes: 2})
				tn := l.open(t, pool, mode)
				gone, other := tn.server, tn.client
				if !serverResets {
					gone, other = other, gone
				}
				// Some traffic first, so that pipes have been used.
				if _, err := gone.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 4)
				_ = other.SetReadDeadline(time.Now().Add(waitBound))
				if _, err := io.ReadFull(other, b); err != nil {
					t.Fatal(err)
				}
				reset(t, gone)
				// The other end is closed by the relay: its read ends.
				if err := readToEnd(t, other); err != nil {
					t.Fatalf("the other end did not see the tunnel close: %v", err)
				}
				r := tn.wait(t)
				if !errors.Is(r.err, syscall.ECONNRESET) {
					t.Errorf("Copy error = %v; want the reset", r.err)
				}
				assertPoolSettled(t, pool, 0)
			})
		}
	}
}

// FuzzCopy drives a tunnel with a random sequence of writes, half-closes,
// resets and closes from both ends and from outside, and checks that the
// relay always ends, that each end receives a prefix of what the other
// sent (all of it when nothing was torn down), and that the pool keeps no
// pipe with data.
func FuzzCopy(f *testing.F) {
	for _, seed := range [][]byte{
		{0, 9, 1, 200, 2, 3},
		{0, 255, 0, 255, 1, 255, 3, 2},
		{0, 40, 4},
		{1, 40, 5},
		{0, 100, 1, 100, 6},
		{2, 1, 50, 3},
		{7, 1, 10},
		{0, 1, 0, 2, 0, 3, 1, 4, 2, 3},
	} {
		f.Add(seed)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 24 {
		ops := make([]byte, 2+rng.IntN(16))
		for i := range ops {
			ops[i] = byte(rng.IntN(256))
		}
		f.Add(ops)
	}
	l := newLn(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		pool := NewPool(Options{Splice: true, Pipes: 1, PipeBytes: 16 << 10})
		tn := l.open(t, pool, wrapMode(len(ops)%3))
		ends := [2]*net.TCPConn{tn.client, tn.server}
		var sent [2]bytes.Buffer
		var got [2]bytes.Buffer // got[i]: what end i received
		var readers sync.WaitGroup
		for i, c := range ends {
			readers.Add(1)
			go func() {
				defer readers.Done()
				_ = c.SetReadDeadline(time.Now().Add(waitBound))
				_, _ = io.Copy(&got[i], c)
			}()
		}
		var writeClosed, gone [2]bool
		tornDown := false
		for i := 0; i < len(ops); i++ {
			op, arg := ops[i]%8, 0
			if i+1 < len(ops) {
				arg = int(ops[i+1])
			}
			switch op {
			case 0, 1: // end op writes arg*997 bytes
				i++
				e := int(op)
				if writeClosed[e] || gone[e] {
					continue
				}
				b := bytes.Repeat([]byte{byte(arg), byte(e)}, arg*997/2+1)
				if _, err := ends[e].Write(b); err != nil {
					tornDown = true
					continue
				}
				sent[e].Write(b)
			case 2, 3: // half-close
				e := int(op - 2)
				if !gone[e] {
					writeClosed[e] = true
					_ = ends[e].CloseWrite()
				}
			case 4, 5: // reset
				e := int(op - 4)
				if !gone[e] {
					gone[e], tornDown = true, true
					_ = ends[e].SetLinger(0)
					_ = ends[e].Close()
				}
			case 6: // shutdown closes the relay's ends
				tornDown = true
				_ = tn.gwClient.Close()
				_ = tn.gwUp.Close()
			case 7: // an end closes both ways
				e := arg % 2
				i++
				if !gone[e] {
					gone[e], tornDown = true, true
					_ = ends[e].Close()
				}
			}
		}
		for e, c := range ends {
			if !gone[e] && !writeClosed[e] {
				_ = c.CloseWrite()
			}
		}
		r := tn.wait(t)
		readers.Wait()
		for e := range ends {
			sentBy, gotAt := sent[e].Bytes(), got[1-e].Bytes()
			if gone[1-e] {
				continue // the receiver is closed: it reads nothing more
			}
			if !bytes.HasPrefix(sentBy, gotAt) {
				t.Errorf("end %d received %d bytes that are not a prefix of the %d sent", 1-e, len(gotAt), len(sentBy))
			}
			if !tornDown && len(gotAt) != len(sentBy) {
				t.Errorf("end %d received %d of %d bytes with nothing torn down", 1-e, len(gotAt), len(sentBy))
			}
		}
		if !tornDown && (r.err != nil || r.up != int64(sent[0].Len()) || r.down != int64(sent[1].Len())) {
			t.Errorf("Copy = %+v; sent %d up, %d down", r, sent[0].Len(), sent[1].Len())
		}
		st := pool.Stats()
		if st.Live != st.Idle || st.Live > 1 {
			t.Errorf("pool %+v: a pipe was kept out or leaked", st)
		}
	})
}

// A bulk direction moves to a large buffer, and gives it back when done.
func TestBulkTakesLargeBuffer(t *testing.T) {
	l := newLn(t)
	pool := NewPool(Options{LargeBuffers: 2})
	tn := l.open(t, pool, bothTCP)
	const n = 8 << 20
	go func() { _, _ = stream(tn.server, n, 7) }()
	go func() { _ = tn.client.CloseWrite() }()
	got, err := io.Copy(io.Discard, tn.client)
	if err != nil || got != n {
		t.Fatalf("client read %d, %v; want %d", got, err, n)
	}
	tn.wait(t)
	st := pool.Stats()
	if st.LargeLive == 0 || st.LargeLive != st.LargeIdle {
		t.Errorf("pool %+v: want a large buffer taken for the bulk and returned", st)
	}
	assertPoolSettled(t, pool, 0)
}

// Small exchanges never take a large buffer.
func TestSmallExchangesStaySmall(t *testing.T) {
	l := newLn(t)
	pool := NewPool(Options{LargeBuffers: 2})
	tn := l.open(t, pool, bothTCP)
	msg := bytes.Repeat([]byte("p"), 1000)
	buf := make([]byte, len(msg))
	for range 50 {
		if _, err := tn.client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(tn.server, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := tn.server.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(tn.client, buf); err != nil {
			t.Fatal(err)
		}
	}
	tn.closeAll()
	tn.wait(t)
	if st := pool.Stats(); st.LargeLive != 0 {
		t.Errorf("pool %+v: a ping-pong of 1,000-byte messages took a large buffer", st)
	}
}

// However many bulk tunnels stall on a slow reader, no more large
// buffers exist than the bound; the others carry on through small ones
// and every byte arrives.
func TestLargeBuffersBounded(t *testing.T) {
	l := newLn(t)
	pool := NewPool(Options{LargeBuffers: 1})
	const tunnels, n = 4, 16 << 20
	tns := make([]*tunnel, tunnels)
	sums := make([]chan [32]byte, tunnels)
	for i := range tns {
		tns[i] = l.open(t, pool, bothTCP)
		// Small socket buffers toward the client, so a writer that is not
		// read from blocks long before its 16 MiB are through.
		_ = tns[i].client.SetReadBuffer(64 << 10)
		_ = tns[i].gwClient.SetWriteBuffer(64 << 10)
		sums[i] = make(chan [32]byte, 1)
		go func() {
			sum, _ := stream(tns[i].server, n, uint64(i))
			sums[i] <- sum
		}()
		_ = tns[i].client.CloseWrite()
	}
	// Nobody reads yet: every tunnel fills its sockets and its writer
	// blocks holding whatever buffer it has. Wait until each tunnel's
	// destination stalls, i.e. a large buffer and misses were seen.
	deadline := time.Now().Add(waitBound)
	for st := pool.Stats(); st.LargeMisses == 0 || st.LargeIdle != 0; st = pool.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("pool %+v: bulk tunnels never contended for the one large buffer", st)
		}
		if st.LargeLive > 1 {
			t.Fatalf("pool %+v: more large buffers than the bound of 1", st)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
	for i, tn := range tns {
		h := sha256.New()
		got, err := io.Copy(h, tn.client)
		if err != nil || got != n {
			t.Fatalf("tunnel %d: client read %d, %v; want %d", i, got, err, n)
		}
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		if want := <-sums[i]; sum != want {
			t.Errorf("tunnel %d: bytes differ from what the server sent", i)
		}
		tn.wait(t)
	}
	if st := pool.Stats(); st.LargeLive > 1 {
		t.Errorf("pool %+v: more large buffers than the bound of 1", st)
	}
	assertPoolSettled(t, pool, 0)
}
