package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// An upstream that answers an upload early (413 after part of the body,
// then close) is relayed to the client as its answer: not a 502, not the
// proxy's failure, never sent again; the client connection, whose body is
// left unread, closes after it. Whether the client sends on or stalls
// after the part the upstream read, the gateway stops reading its body.
func TestEarlyAnswerToUploadRelayed(t *testing.T) {
	const size, partial = 256 << 20, 64 << 10
	for _, stall := range []bool{false, true} {
		t.Run(map[bool]string{false: "client sends on", true: "client stalls"}[stall], func(t *testing.T) {
			h := start(t, "")
			up := scriptedUpstream(t, h, true, func(head string, br *bufio.Reader) string {
				_, _ = io.CopyN(io.Discard, br, partial)
				return "HTTP/1.1 413 Content Too Large\r\nContent-Length: 9\r\n\r\ntoo large"
			})
			c, br := h.dial(t)
			fmt.Fprintf(c, "POST http://127.0.0.1:9/up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
			sent := make(chan int64, 1)
			go func() {
				// Until the gateway stops reading and closes, or only
				// what the upstream reads.
				limit := int64(size)
				if stall {
					limit = partial
				}
				chunk := []byte(strings.Repeat("x", 16<<10))
				var n int64
				for n < limit {
					k, err := c.Write(chunk)
					n += int64(k)
					if err != nil {
						break
					}
				}
				sent <- n
			}()
			resp, body := readAll(t, br, "POST")
			if resp.StatusCode != 413 || body != "too large" || resp.Header.Get("X-Proxypool-Reason") != "" {
				t.Fatalf("%d %q (%s)", resp.StatusCode, body, resp.Header.Get("X-Proxypool-Reason"))
			}
			if !resp.Close || !closedAfterAnswer(br) {
				t.Fatalf("close=%v: the connection with an unread body was kept", resp.Close)
			}
			if n := <-sent; n >= size {
				t.Fatalf("the gateway read the whole body (%d bytes) after the answer", n)
			}
			h.idle(t)
			gwtest.Eventually(t, "the request's outcome reported", func() bool { return len(h.sink.outcomes()) > 0 })
			for _, o := range h.sink.outcomes() {
				if !o.Success || o.Phase != worker.PhaseNone {
					t.Fatalf("outcome %+v: the early answer was blamed on the proxy", o)
				}
			}
			for _, phase := range []string{"response_headers", "tunnel"} {
				if f := h.metric(t, "proxypool_gateway_upstream_failures_total", "phase", phase); f != 0 {
					t.Fatalf("%v %s failures counted", f, phase)
				}
			}
			if r := h.metric(t, "proxypool_gateway_retries_total"); r != 0 {
				t.Fatalf("the upload was retried %v times", r)
			}
			if n := up.conns.Load(); n != 1 {
				t.Fatalf("%d upstream connections: the upload was sent again", n)
			}
		})
	}
}

// closedAfterAnswer reports whether the gateway closed the connection
// after its answer: EOF, or a reset when the client was still sending
// (the gateway's lingering close drains only so much).
func closedAfterAnswer(br *bufio.Reader) bool {
	_, err := br.ReadByte()
	return err == io.EOF || errors.Is(err, syscall.ECONNRESET)
}

// An upload the upstream reads whole is answered as before, and the
// client connection carries on: another upload, then a GET.
func TestUploadKeepsClientConnection(t *testing.T) {
	h := start(t, "")
	up := scriptedUpstream(t, h, false, func(head string, br *bufio.Reader) string {
		n := int64(0)
		if i := strings.Index(head, "Content-Length: "); i >= 0 {
			v, _, _ := strings.Cut(head[i+len("Content-Length: "):], "\r\n")
			n, _ = strconv.ParseInt(v, 10, 64)
		}
		got, _ := io.Copy(io.Discard, io.LimitReader(br, n))
		msg := strconv.FormatInt(got, 10)
		return "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(msg)) + "\r\n\r\n" + msg
	})
	c, br := h.dial(t)
	const size = 1 << 20
	for i := range 2 {
		fmt.Fprintf(c, "POST http://127.0.0.1:9/up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
		if _, err := io.WriteString(c, strings.Repeat("y", size)); err != nil {
			t.Fatal(err)
		}
		resp, body := readAll(t, br, "POST")
		if resp.StatusCode != 200 || body != strconv.Itoa(size) || resp.Close {
			t.Fatalf("upload %d: %d %q close=%v", i, resp.StatusCode, body, resp.Close)
		}
	}
	io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := readAll(t, br, "GET"); resp.StatusCode != 200 || body != "0" || resp.Close {
		t.Fatalf("GET after uploads: %d %q close=%v", resp.StatusCode, body, resp.Close)
	}
	if n := up.conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections for three requests", n)
	}
	h.idle(t)
	if f := h.metric(t, "proxypool_gateway_upstream_failures_total", "phase", "response_headers"); f != 0 {
		t.Fatalf("%v failures blamed on the proxy", f)
	}
}
