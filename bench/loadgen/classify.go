package loadgen

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
)

// Class is the outcome class of one operation.
type Class string

// The classes a run reports. Proxy407 and Proxy503 are answers of the
// proxy itself: a 407, a non-200 answer to CONNECT, or a 503 carrying a
// proxy's own marker header (see proxyMarkers); other 4xx/5xx are the
// target's as far as the client can tell.
const (
	ClassOK       Class = "ok"
	ClassTimeout  Class = "timeout"
	ClassRefused  Class = "refused"
	ClassReset    Class = "reset"
	ClassHTTP4xx  Class = "http_4xx"
	ClassHTTP5xx  Class = "http_5xx"
	ClassProxy407 Class = "proxy_407"
	ClassProxy503 Class = "proxy_503"
	ClassProxyErr Class = "proxy_other" // any other non-200 answer to CONNECT
	ClassOther    Class = "other"
	// ClassUnsent counts open-loop operations still waiting for a worker
	// when the hard bound stopped the run.
	ClassUnsent Class = "unsent"
	// ClassCut counts operations in flight when the hard bound (or a
	// cancel) stopped the run.
	ClassCut Class = "cut"
)

// proxyMarkers are headers proxies put on answers they make up
// themselves: Proxy Pool's gateway, Squid. A 503 carrying one is the
// proxy's refusal rather than the target's.
var proxyMarkers = []string{"X-Proxypool-Reason", "X-Squid-Error"}

// ClassifyStatus classifies a response the client received.
func ClassifyStatus(status int, h http.Header) Class {
	switch {
	case status == http.StatusProxyAuthRequired:
		return ClassProxy407
	case status == http.StatusServiceUnavailable && hasMarker(h):
		return ClassProxy503
	case status >= 500:
		return ClassHTTP5xx
	case status >= 400:
		return ClassHTTP4xx
	case status >= 100:
		return ClassOK
	}
	return ClassOther
}

// ClassifyConnect classifies a proxy's answer to CONNECT.
func ClassifyConnect(status int) Class {
	switch {
	case status == http.StatusOK:
		return ClassOK
	case status == http.StatusProxyAuthRequired:
		return ClassProxy407
	case status == http.StatusServiceUnavailable:
		return ClassProxy503
	}
	return ClassProxyErr
}

func hasMarker(h http.Header) bool {
	for _, k := range proxyMarkers {
		if h.Get(k) != "" {
			return true
		}
	}
	return false
}

// connectError is a non-200 answer to CONNECT, seen by net/http's
// OnProxyConnectResponse hook or by our own tunnel code.
type connectError struct{ status int }

func (e *connectError) Error() string {
	return "proxy answered CONNECT with " + http.StatusText(e.status)
}

// ClassifyError classifies an operation that failed without a usable
// response.
func ClassifyError(err error) Class {
	var ce *connectError
	var ne net.Error
	switch {
	case err == nil:
		return ClassOK
	case errors.As(err, &ce):
		return ClassifyConnect(ce.status)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return ClassTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		return ClassReset
	}
	return ClassOther
}
