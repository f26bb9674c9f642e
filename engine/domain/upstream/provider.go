package upstream

import (
	"context"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// ABIVersion is the version of the provider adapter contract. Plugins
// declare the version they implement; the host refuses any other.
const ABIVersion = 1

// BuildInput is what the host hands an adapter to build a request.
type BuildInput struct {
	Params  map[string]string
	Secrets map[string]string // resolved values; adapters must not log them
	Count   int               // how many proxies the controller wants
	Now     time.Time         // the fetch time; adapters have no clock
}

// Request is the HTTP call an adapter asks the host to perform.
type Request struct {
	Method  string
	URL     string
	Headers map[string]string
	Body    []byte
}

// Response is what the host received.
type Response struct {
	Status  int
	Headers map[string]string // canonical names, first value
	Body    []byte
	// Params are the upstream's params as given to BuildRequest, handed
	// back so parsing can use what the vendor does not send (a fixed TTL).
	Params map[string]string
}

// ParseResult is an adapter's reading of a response.
type ParseResult struct {
	Proxies []proxy.Candidate
	// RetryAfter asks the host to wait before the next call (0 = no hint).
	RetryAfter time.Duration
}

// Adapter turns params into a request and a response into candidates. It
// never touches files, network or environment: the host does the I/O.
type Adapter interface {
	BuildRequest(ctx context.Context, in BuildInput) (Request, error)
	ParseResponse(ctx context.Context, resp Response, now time.Time) (ParseResult, error)
}

// Provider resolves adapters by plugin name; reload swaps the set.
type Provider interface {
	Adapter(name string) (Adapter, error)
}
