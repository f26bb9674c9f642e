package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

func TestClassifyStatus(t *testing.T) {
	marked := func(k string) http.Header { h := http.Header{}; h.Set(k, "x"); return h }
	tests := []struct {
		name   string
		status int
		h      http.Header
		want   Class
	}{
		{"ok", 200, nil, ClassOK},
		{"redirect is an answer", 302, nil, ClassOK},
		{"proxy auth", 407, nil, ClassProxy407},
		{"gateway's own 503", 503, marked("X-Proxypool-Reason"), ClassProxy503},
		{"squid's own 503", 503, marked("X-Squid-Error"), ClassProxy503},
		{"target's 503", 503, http.Header{}, ClassHTTP5xx},
		{"502", 502, nil, ClassHTTP5xx},
		{"404", 404, nil, ClassHTTP4xx},
		{"nonsense", 0, nil, ClassOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassifyStatus(tt.status, tt.h); got != tt.want {
				t.Fatalf("ClassifyStatus(%d) = %s, want %s", tt.status, got, tt.want)
			}
		})
	}
}

// timeoutErr is what net.Conn deadlines return.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassifyError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Class
	}{
		{"nil", nil, ClassOK},
		{"context deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), ClassTimeout},
		{"net timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, ClassTimeout},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, ClassRefused},
		{"reset", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, ClassReset},
		{"broken pipe", &net.OpError{Op: "write", Err: syscall.EPIPE}, ClassReset},
		{"cut body", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), ClassReset},
		{"connect 407", &connectError{status: 407}, ClassProxy407},
		{"connect 503", fmt.Errorf("wrapped: %w", &connectError{status: 503}), ClassProxy503},
		{"connect 502", &connectError{status: 502}, ClassProxyErr},
		{"anything else", errors.New("tls: bad certificate"), ClassOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassifyError(tt.err); got != tt.want {
				t.Fatalf("ClassifyError(%v) = %s, want %s", tt.err, got, tt.want)
			}
		})
	}
}

// TestClassifyRealErrors checks the classes against what the network
// really returns on loopback.
func TestClassifyRealErrors(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = net.DialTimeout("tcp", addr, 5*time.Second)
		if got := ClassifyError(err); got != ClassRefused {
			t.Fatalf("dialing a closed port: %v classified %s, want refused", err, got)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		_ = a.SetReadDeadline(time.Now().Add(-time.Second))
		_, err := a.Read(make([]byte, 1))
		if got := ClassifyError(err); got != ClassTimeout {
			t.Fatalf("read past deadline: %v classified %s, want timeout", err, got)
		}
	})
}
