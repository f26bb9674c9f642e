package transport_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
	"github.com/proxypool/proxypool/engine/gateway/transport"
)

// uploadSize is a request body far larger than what loopback socket
// buffers hold, so that a writer the upstream stops reading blocks.
const uploadSize = 256 << 20

// upload is a request body of n bytes made up as it is read.
type upload struct {
	left int64
	read atomic.Int64
}

func (u *upload) Read(p []byte) (int, error) {
	if u.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), u.left)
	for i := range p[:n] {
		p[i] = 'x'
	}
	u.left -= n
	u.read.Add(n)
	return int(n), nil
}

// earlyUpstream is an upstream proxy that reads a request head and at most
// partial bytes of its body, then answers reply. With closeAfter it closes
// at once (unread body bytes make that a reset); without, it reads nothing
// more until release is closed, then drains until the gateway side closes.
// peerClosed is closed once the upstream saw the gateway close.
type earlyUpstream struct {
	target     *snapshot.Target
	conns      atomic.Int64
	release    chan struct{}
	peerClosed chan struct{}
}

func newEarlyUpstream(t *testing.T, partial int64, reply string, closeAfter bool) *earlyUpstream {
	t.Helper()
	u := &earlyUpstream{release: make(chan struct{}), peerClosed: make(chan struct{})}
	host, port := gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
		defer c.Close()
		if u.conns.Add(1) > 1 {
			return
		}
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
		}
		if _, err := io.CopyN(io.Discard, br, partial); err != nil {
			return
		}
		if _, err := io.WriteString(c, reply); err != nil || closeAfter {
			return
		}
		<-u.release
		_, _ = io.Copy(io.Discard, br)
		close(u.peerClosed)
	}))
	u.target = target(t, gwtest.MakeProxy("u", host, port, "", "", time.Now()))
	return u
}

// noLeak waits until the process is back to at most n goroutines: every
// body writer has ended.
func noLeak(t *testing.T, n int) {
	t.Helper()
	gwtest.Eventually(t, "goroutines back to "+strconv.Itoa(n), func() bool { return runtime.NumGoroutine() <= n })
}

func TestEarlyAnswerDuringUpload(t *testing.T) {
	tests := []struct {
		name       string
		reply      string
		closeAfter bool
		status     int
		body       string
	}{
		{"413 then close", "HTTP/1.1 413 Content Too Large\r\nContent-Length: 9\r\n\r\ntoo large", true, 413, "too large"},
		// The upstream keeps the connection but reads nothing more: the
		// body writer is blocked in a write and must be stopped there.
		{"413 kept alive, body left unread", "HTTP/1.1 413 Content Too Large\r\nContent-Length: 9\r\n\r\ntoo large", false, 413, "too large"},
		{"streamed response", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nstream\r\n0\r\n\r\n", false, 200, "6\r\nstream\r\n0\r\n\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newEarlyUpstream(t, 64<<10, tc.reply, tc.closeAfter)
			tr := transport.New(transport.Options{})
			defer tr.Close()
			before := runtime.NumGoroutine()
			body := &upload{left: uploadSize}
			req := request("POST", body, "Content-Length: "+strconv.Itoa(uploadSize)+"\r\n")
			resp, got, err := exchange(tr, &wireProxy{target: up.target}, req)
			if err != nil {
				t.Fatalf("early answer reported as %v", err)
			}
			if resp.Status != tc.status || got != tc.body || !resp.BodyUnsent {
				t.Fatalf("status %d body %q unsent %v", resp.Status, got, resp.BodyUnsent)
			}
			if n := body.read.Load(); n >= uploadSize {
				t.Fatalf("the whole body (%d bytes) was sent after the answer", n)
			}
			if tr.IdleConns() != 0 {
				t.Fatal("the connection of a partly sent request was kept")
			}
			close(up.release)
			if !tc.closeAfter {
				<-up.peerClosed
			}
			noLeak(t, before)
			if n := up.conns.Load(); n != 1 {
				t.Fatalf("%d upstream connections: the upload was sent again", n)
			}
		})
	}
}

// A body read that waits on a client which stopped sending is ended
// through StopBody once the upstream has answered.
func TestEarlyAnswerStopsStalledBody(t *testing.T) {
	up := newEarlyUpstream(t, 1<<10, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n", false)
	tr := transport.New(transport.Options{})
	defer tr.Close()
	before := runtime.NumGoroutine()
	pr, pw := io.Pipe()
	sent := make(chan error, 1)
	go func() {
		// 1 KiB, then the client stalls (the pipe stays open).
		_, err := pw.Write([]byte(strings.Repeat("x", 1<<10)))
		sent <- err
	}()
	var stops atomic.Int64
	req := request("POST", pr, "Content-Length: 1000000\r\n")
	req.StopBody = func() {
		stops.Add(1)
		_ = pw.CloseWithError(os.ErrDeadlineExceeded) // as a past read deadline does
	}
	resp, _, err := exchange(tr, &wireProxy{target: up.target}, req)
	if err != nil || resp.Status != 413 || !resp.BodyUnsent {
		t.Fatalf("resp %v err %v", resp, err)
	}
	if n := stops.Load(); n != 1 {
		t.Fatalf("StopBody called %d times", n)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	close(up.release)
	<-up.peerClosed
	noLeak(t, before)
}

// An upstream that reads the whole body before answering: nothing is
// stopped, the connection is kept and carries the next upload.
func TestUploadKeepAlive(t *testing.T) {
	const size = 4 << 20
	p := newWireProxy(t, false, func(head string, br *bufio.Reader) string {
		n, err := io.Copy(io.Discard, io.LimitReader(br, size))
		if err != nil || n != size {
			return "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nreceived"
	})
	tr := transport.New(transport.Options{})
	defer tr.Close()
	for i := range 2 {
		body := &upload{left: size}
		resp, got, err := exchange(tr, p, request("POST", body, "Content-Length: "+strconv.Itoa(size)+"\r\n"))
		if err != nil || resp.Status != 200 || got != "received" || resp.BodyUnsent {
			t.Fatalf("upload %d: %v %q %v", i, resp, got, err)
		}
		if tr.IdleConns() != 1 {
			t.Fatalf("upload %d: connection not kept", i)
		}
	}
	if n := p.conns.Load(); n != 1 {
		t.Fatalf("%d connections for two uploads", n)
	}
}

// ResponseHeaderTimeout counts from the end of the body, not from the
// head: an upload slower than the timeout is not cut short.
func TestHeaderTimeoutCountsFromBodyEnd(t *testing.T) {
	const timeout = 100 * time.Millisecond
	p := newWireProxy(t, false, func(head string, br *bufio.Reader) string {
		if _, err := io.CopyN(io.Discard, br, 8); err != nil {
			return ""
		}
		return "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
	})
	tr := transport.New(transport.Options{ResponseHeaderTimeout: timeout})
	defer tr.Close()
	// Half the body, then a pause of three timeouts, then the rest.
	body := io.MultiReader(strings.NewReader("half"), &gate{after: time.After(3 * timeout), r: strings.NewReader("rest")})
	resp, _, err := exchange(tr, p, request("POST", body, "Content-Length: 8\r\n"))
	if err != nil || resp.Status != 201 {
		t.Fatalf("slow upload: %v %v", resp, err)
	}
}

// gate holds its first read until after fires.
type gate struct {
	after <-chan time.Time
	r     io.Reader
}

func (g *gate) Read(p []byte) (int, error) {
	if g.after != nil {
		<-g.after
		g.after = nil
	}
	return g.r.Read(p)
}

// A client body that breaks while the upstream waits for the rest ends
// the exchange at once as the client's failure (no header timeout).
func TestBrokenBodyWakesReader(t *testing.T) {
	up := newEarlyUpstream(t, 2, "", false) // reads 2 bytes, then waits for more
	tr := transport.New(transport.Options{ResponseHeaderTimeout: time.Hour})
	defer tr.Close()
	broken := io.MultiReader(strings.NewReader("ab"), errReader{})
	done := make(chan error, 1)
	go func() {
		resp := &transport.Response{}
		done <- tr.RoundTrip(context.Background(), request("POST", broken, "Content-Length: 4\r\n"), up.target, resp)
	}()
	select {
	case err := <-done:
		var be *transport.BodyError
		if !errors.As(err, &be) {
			t.Fatalf("err = %v, want a BodyError", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a broken body left the exchange waiting for the upstream")
	}
	close(up.release)
}

// An upstream that stops reading the body and never answers fails the
// exchange within its timeouts instead of holding the writer forever.
func TestStalledUpstreamFailsUpload(t *testing.T) {
	up := newEarlyUpstream(t, 64<<10, "", false)
	tr := transport.New(transport.Options{ResponseHeaderTimeout: 200 * time.Millisecond})
	defer tr.Close()
	before := runtime.NumGoroutine()
	body := &upload{left: uploadSize}
	req := request("POST", body, "Content-Length: "+strconv.Itoa(uploadSize)+"\r\n")
	_, _, err := exchange(tr, &wireProxy{target: up.target}, req)
	var te *transport.Error
	if !errors.As(err, &te) || te.Phase != worker.PhaseResponseHeaders {
		t.Fatalf("stalled upstream: %v, want a response_headers failure", err)
	}
	if n := body.read.Load(); n >= uploadSize {
		t.Fatalf("the whole body (%d bytes) went to an upstream that read none of it", n)
	}
	close(up.release)
	<-up.peerClosed // the failed connection was closed, not kept
	noLeak(t, before)
}
