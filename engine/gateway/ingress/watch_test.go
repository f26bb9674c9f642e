//go:build unix

package ingress

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// watchedConn returns a server-side conn of a fresh loopback connection,
// between requests (no body), and the client's end.
func watchedConn(t *testing.T) (*conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{}
	srv.ctx, srv.cancel = context.WithCancel(context.Background())
	c := &conn{srv: srv, nc: nc, raw: nc}
	t.Cleanup(func() {
		c.br.Release()
		nc.Close()
		srv.cancel()
	})
	c.br.Reset(c.raw)
	c.body.ResetNone()
	c.context()
	// What the request head leaves: a read deadline the wait must not keep.
	_ = nc.SetReadDeadline(time.Now().Add(time.Hour))
	return c, client
}

func (c *conn) watchState() uint8 {
	c.watch.mu.Lock()
	defer c.watch.mu.Unlock()
	return c.watch.state
}

const pipelined = "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n"

// readPipelined checks that the connection's reader gets the whole head
// the client sent, with no deadline left on the connection.
func readPipelined(t *testing.T, c *conn) {
	t.Helper()
	head, err := c.br.ReadHead(4096, true)
	if err != nil || string(head) != pipelined {
		t.Fatalf("reader got %q, %v; want the pipelined head whole", head, err)
	}
}

func TestWatchStopsWithinGrace(t *testing.T) {
	c, client := watchedConn(t)
	for range 3 {
		c.watchClient()
		if c.unwatchClient() {
			t.Fatal("a client that stayed was found gone")
		}
	}
	if _, err := io.WriteString(client, pipelined); err != nil {
		t.Fatal(err)
	}
	readPipelined(t, c)
}

func TestWatchLeavesPipelinedBytes(t *testing.T) {
	c, client := watchedConn(t)
	c.watchClient()
	gwtest.Eventually(t, "watcher running", func() bool { return c.watchState() == watchRunning })
	if _, err := io.WriteString(client, pipelined); err != nil {
		t.Fatal(err)
	}
	// The watcher sees the bytes, stops on its own and takes none.
	gwtest.Eventually(t, "watcher ended", func() bool { return c.watchState() == watchEnded })
	if c.unwatchClient() {
		t.Fatal("a client that sent more was found gone")
	}
	if c.ctx.Err() != nil {
		t.Fatal("context canceled")
	}
	readPipelined(t, c)
}

func TestUnwatchWakesWatcher(t *testing.T) {
	c, client := watchedConn(t)
	for range 2 { // the connection can be watched again
		c.watchClient()
		gwtest.Eventually(t, "watcher running", func() bool { return c.watchState() == watchRunning })
		if c.unwatchClient() {
			t.Fatal("a client that stayed was found gone")
		}
	}
	if _, err := io.WriteString(client, pipelined); err != nil {
		t.Fatal(err)
	}
	// No past deadline is left behind: the read waits for the bytes.
	readPipelined(t, c)
}

func TestWatchFindsClientGone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(net.Conn)
	}{
		{"close", func(c net.Conn) { c.Close() }},
		{"reset", func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0); c.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, client := watchedConn(t)
			c.watchClient()
			tc.leave(client)
			gwtest.Eventually(t, "context canceled", func() bool { return c.ctx.Err() != nil })
			if !c.unwatchClient() {
				t.Fatal("client not found gone")
			}
			// The connection was closed by the watcher.
			if _, err := c.nc.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("read after the client left: %v, want closed", err)
			}
		})
	}
}
