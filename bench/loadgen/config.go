package loadgen

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Mode is what one operation of a run is.
type Mode string

const (
	// ModeHTTP sends requests over keep-alive clients, one connection
	// each; through Proxy when set (absolute-form for http://, CONNECT
	// then TLS for https://, as any HTTP client does).
	ModeHTTP Mode = "http"
	// ModeConnect opens a new tunnel per operation (CONNECT, 200, one
	// request inside, close): the connection-setup rate.
	ModeConnect Mode = "connect"
	// ModeTunnels opens Tunnels long-lived tunnels, holds them for the
	// run and sends requests through each every TunnelInterval.
	ModeTunnels Mode = "tunnels"
	// ModeExtract POSTs Distribution extract calls (URL is the
	// /v1/extract endpoint) and counts the proxies returned.
	ModeExtract Mode = "extract"
)

// Defaults. Named so the flags and the documentation can refer to them.
const (
	DefaultConcurrency      = 64
	DefaultTimeout          = 10 * time.Second
	DefaultMaxDuration      = 10 * time.Minute
	DefaultSampleInterval   = time.Second
	DefaultProgressInterval = 10 * time.Second
	DefaultExtractCount     = 1
	// MaxConcurrency bounds workers, and MaxTunnels the tunnels held; both
	// are far above what one 20,000-descriptor process can carry anyway.
	MaxConcurrency = 20_000
	MaxTunnels     = 100_000
	// MaxBodyBytes bounds the request body a run may send.
	MaxBodyBytes = 64 << 20
)

// Config describes one run. Zero values get the defaults above; Validate
// applies them and reports every problem at once.
type Config struct {
	Scenario string
	Mode     Mode
	// URL is the target (http:// or https://), or the extract endpoint.
	URL string
	// Proxy is the proxy to go through (http://[user:pass@]host:port);
	// empty goes to URL directly (connect and tunnels modes then measure
	// plain connection setup to the target: the "direct" limit).
	Proxy   string
	Method  string
	Headers http.Header
	Body    []byte

	// Requests bounds the operations (0: no count bound); Duration bounds
	// the time operations are issued (0: no time bound). At least one is
	// required, except in tunnels mode which needs Duration.
	Requests int64
	Duration time.Duration
	// MaxDuration is the hard stop, whatever else happens.
	MaxDuration time.Duration
	// Concurrency bounds operations in flight (and tunnel setups in
	// flight in tunnels mode).
	Concurrency int
	// Rate, when positive, is the target operations per second of an
	// open-loop schedule; latency is then measured from each operation's
	// intended send time. 0 sends as fast as the workers can (closed
	// loop), measuring from the actual send.
	Rate float64
	// Timeout bounds one operation (and one tunnel setup).
	Timeout time.Duration
	// Insecure skips TLS verification of https:// targets.
	Insecure bool
	// DisableKeepAlive opens a new connection per request in http mode.
	DisableKeepAlive bool

	// Tunnels is how many tunnels tunnels mode holds; TunnelInterval how
	// often each sends a request to URL through itself (0: back to back,
	// which measures bulk throughput).
	Tunnels        int
	TunnelInterval time.Duration

	// ExtractCount is the count of each extract call.
	ExtractCount int

	// SUTPIDs are the processes of the system under test to sample;
	// SUTTree adds their descendants (Squid's worker kids).
	SUTPIDs        []int
	SUTTree        bool
	SampleInterval time.Duration

	// Progress receives a line every ProgressInterval (nil: none).
	Progress         io.Writer
	ProgressInterval time.Duration
}

// Validate applies defaults and checks the configuration, returning every
// problem found.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Mode == "" {
		c.Mode = ModeHTTP
	}
	if c.Scenario == "" {
		c.Scenario = string(c.Mode)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxDuration == 0 {
		c.MaxDuration = DefaultMaxDuration
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = DefaultProgressInterval
	}
	if c.Method == "" {
		c.Method = http.MethodGet
		if c.Mode == ModeExtract {
			c.Method = http.MethodPost
		}
	}
	if c.Mode == ModeExtract && c.ExtractCount == 0 {
		c.ExtractCount = DefaultExtractCount
	}
	switch c.Mode {
	case ModeHTTP, ModeConnect, ModeTunnels, ModeExtract:
	default:
		bad("mode %q: want http, connect, tunnels or extract", c.Mode)
	}
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		bad("url is required")
	case err != nil:
		bad("url: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		bad("url %q: scheme must be http or https", c.URL)
	case u.Host == "":
		bad("url %q: no host", c.URL)
	}
	if c.Proxy != "" {
		p, err := url.Parse(c.Proxy)
		switch {
		case err != nil:
			bad("proxy: %w", err)
		case p.Scheme != "http" || p.Host == "":
			bad("proxy %q: want http://[user:pass@]host:port", c.Proxy)
		}
	}
	if c.Requests < 0 {
		bad("requests must be >= 0, got %d", c.Requests)
	}
	if c.Duration < 0 {
		bad("duration must be >= 0, got %s", c.Duration)
	}
	if c.Mode == ModeTunnels {
		if c.Duration <= 0 {
			bad("tunnels mode needs a duration to hold the tunnels")
		}
		if c.Tunnels < 1 || c.Tunnels > MaxTunnels {
			bad("tunnels must be 1..%d, got %d", MaxTunnels, c.Tunnels)
		}
		if c.TunnelInterval < 0 {
			bad("tunnel interval must be >= 0, got %s", c.TunnelInterval)
		}
	} else if c.Requests == 0 && c.Duration == 0 {
		bad("set a request count or a duration (or both)")
	}
	if c.Duration > c.MaxDuration {
		bad("duration %s exceeds the hard bound %s", c.Duration, c.MaxDuration)
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		bad("concurrency must be 1..%d, got %d", MaxConcurrency, c.Concurrency)
	}
	if c.Rate < 0 {
		bad("rate must be >= 0, got %g", c.Rate)
	}
	if c.Timeout < 0 || c.MaxDuration < 0 || c.SampleInterval < 0 || c.ProgressInterval < 0 {
		bad("timeouts and intervals must be positive")
	}
	if len(c.Body) > MaxBodyBytes {
		bad("body is %d bytes, above %d", len(c.Body), MaxBodyBytes)
	}
	if c.ExtractCount < 0 {
		bad("extract count must be >= 0, got %d", c.ExtractCount)
	}
	for _, pid := range c.SUTPIDs {
		if pid <= 0 {
			bad("sut pid must be positive, got %d", pid)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid load: %w", errors.Join(errs...))
	}
	return nil
}
