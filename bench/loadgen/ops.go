package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// maxExtractAnswer bounds the extract answer read to count proxies.
const maxExtractAnswer = 16 << 20

// newOperation builds the operation of an http, connect or extract run,
// and what to release once the run is over.
func newOperation(cfg *Config) (operation, func(), error) {
	target, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing url: %w", err)
	}
	switch cfg.Mode {
	case ModeConnect:
		tun, err := newTunneler(cfg, target)
		if err != nil {
			return nil, nil, err
		}
		return tun.once, func() {}, nil
	case ModeHTTP, ModeExtract:
		return newHTTPOperation(cfg)
	}
	return nil, nil, fmt.Errorf("mode %q has no per-operation driver", cfg.Mode)
}

// newHTTPOperation gives each worker its own Transport holding at most one
// connection: Concurrency keep-alive clients, as the benchmarks require.
func newHTTPOperation(cfg *Config) (operation, func(), error) {
	var proxy func(*http.Request) (*url.URL, error)
	if cfg.Proxy != "" {
		pu, err := url.Parse(cfg.Proxy)
		if err != nil {
			return nil, nil, fmt.Errorf("parsing proxy: %w", err)
		}
		proxy = http.ProxyURL(pu)
	}
	body := cfg.Body
	if cfg.Mode == ModeExtract && body == nil {
		body = fmt.Appendf(nil, `{"count":%d,"fulfillment":"partial"}`, cfg.ExtractCount)
	}
	headers := cfg.Headers.Clone()
	if headers == nil {
		headers = http.Header{}
	}
	if cfg.Mode == ModeExtract && headers.Get("Content-Type") == "" {
		headers.Set("Content-Type", "application/json")
	}
	host := headers.Get("Host")
	headers.Del("Host")

	transports := make([]*http.Transport, cfg.Concurrency)
	clients := make([]*http.Client, cfg.Concurrency)
	for i := range clients {
		transports[i] = &http.Transport{
			Proxy:               proxy,
			DialContext:         (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1,
			MaxIdleConnsPerHost: 1,
			DisableKeepAlives:   cfg.DisableKeepAlive,
			DisableCompression:  true,
			TLSClientConfig:     &tls.Config{InsecureSkipVerify: cfg.Insecure}, //nolint:gosec // -insecure is the user's explicit choice for test targets
			TLSHandshakeTimeout: cfg.Timeout,
			// net/http reports a refused CONNECT only as status text; this
			// keeps the code so 407 and 503 can be told apart.
			OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
				if res.StatusCode != http.StatusOK {
					return &connectError{status: res.StatusCode}
				}
				return nil
			},
		}
		clients[i] = &http.Client{
			Transport: transports[i],
			// A redirect is the target's answer; following it would
			// measure a second request.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	extract := cfg.Mode == ModeExtract
	op := func(ctx context.Context, w int) outcome {
		ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		var rd io.Reader
		if len(body) > 0 {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, cfg.Method, cfg.URL, rd)
		if err != nil {
			return outcome{class: ClassOther}
		}
		for k, vs := range headers {
			req.Header[k] = vs
		}
		if host != "" {
			req.Host = host
		}
		resp, err := clients[w].Do(req)
		if err != nil {
			return outcome{class: ClassifyError(err)}
		}
		defer resp.Body.Close()
		o := outcome{class: ClassifyStatus(resp.StatusCode, resp.Header)}
		if extract && resp.StatusCode == http.StatusOK {
			var ans struct {
				Returned int64 `json:"returned"`
			}
			cr := &countingReader{r: io.LimitReader(resp.Body, maxExtractAnswer)}
			if err := json.NewDecoder(cr).Decode(&ans); err != nil {
				return outcome{class: ClassifyError(err), bytes: cr.n}
			}
			o.returned = ans.Returned
			n, err := discard(resp.Body)
			o.bytes = cr.n + n
			if err != nil {
				o.class = ClassifyError(err)
			}
			return o
		}
		n, err := discard(resp.Body)
		o.bytes = n
		if err != nil {
			// A body cut short is a failure, whatever the status said.
			o.class = ClassifyError(err)
		}
		return o
	}
	cleanup := func() {
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}
	return op, cleanup, nil
}

// discardBytes is the read size of discard: large, so a bulk response is
// read in few system calls and the load generator's own cost stays small
// beside the proxy's (io.Discard alone reads 8 KiB at a time).
const discardBytes = 256 << 10

var discardBufs = sync.Pool{New: func() any { b := make([]byte, discardBytes); return &b }}

// discard reads r to its end through a pooled buffer held only for the
// copy, so thousands of idle tunnels hold none.
func discard(r io.Reader) (int64, error) {
	b := discardBufs.Get().(*[]byte)
	defer discardBufs.Put(b)
	// The wrappers keep io.CopyBuffer from handing the copy to
	// io.Discard's ReadFrom, which would use its own 8 KiB buffer.
	return io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{r}, *b)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// tunneler opens tunnels to the target (through the proxy with CONNECT,
// or directly) and sends HTTP/1.1 requests through them.
type tunneler struct {
	cfg       *Config
	target    *url.URL
	authority string // host:port of the target
	proxyAddr string // host:port of the proxy; "" for direct
	proxyAuth string // Proxy-Authorization value, if any
	dialer    *net.Dialer
	tlsConf   *tls.Config // nil for http:// targets
	request   []byte      // the serialized request sent through tunnels
}

func newTunneler(cfg *Config, target *url.URL) (*tunneler, error) {
	t := &tunneler{cfg: cfg, target: target, dialer: &net.Dialer{Timeout: cfg.Timeout}}
	t.authority = target.Host
	if target.Port() == "" {
		port := "80"
		if target.Scheme == "https" {
			port = "443"
		}
		t.authority = net.JoinHostPort(target.Hostname(), port)
	}
	if cfg.Proxy != "" {
		pu, err := url.Parse(cfg.Proxy)
		if err != nil {
			return nil, fmt.Errorf("parsing proxy: %w", err)
		}
		t.proxyAddr = pu.Host
		if pu.User != nil {
			pass, _ := pu.User.Password()
			t.proxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(pu.User.Username()+":"+pass))
		}
	}
	if target.Scheme == "https" {
		t.tlsConf = &tls.Config{ServerName: target.Hostname(), InsecureSkipVerify: cfg.Insecure, NextProtos: []string{"http/1.1"}} //nolint:gosec // see -insecure
	}
	var b bytes.Buffer
	req, err := http.NewRequest(cfg.Method, cfg.URL, bytes.NewReader(cfg.Body))
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	for k, vs := range cfg.Headers {
		req.Header[k] = vs
	}
	if h := cfg.Headers.Get("Host"); h != "" {
		req.Host = h
	}
	if cfg.Mode == ModeConnect {
		req.Close = true // one request per tunnel: tell the target
	}
	req.Header.Set("User-Agent", "proxy-loadgen")
	if err := req.Write(&b); err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	t.request = b.Bytes()
	return t, nil
}

// tunnel is one open tunnel.
type tunnel struct {
	conn net.Conn
	br   *bufio.Reader
}

// open dials and, through a proxy, sends CONNECT and waits for the 200;
// for https:// targets it then shakes hands with the target over it. The
// returned duration is the setup time (dial to usable tunnel).
func (t *tunneler) open(ctx context.Context) (*tunnel, time.Duration, error) {
	begin := time.Now()
	addr := t.proxyAddr
	if addr == "" {
		addr = t.authority
	}
	conn, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	br := bufio.NewReaderSize(conn, 4096)
	if t.proxyAddr != "" {
		if err := t.connect(conn, br); err != nil {
			conn.Close()
			return nil, 0, err
		}
	}
	tun := &tunnel{conn: conn, br: br}
	if t.tlsConf != nil {
		// Bytes the proxy sent after its 200 are the target's: read them
		// through the same buffer.
		tc := tls.Client(&bufferedConn{Conn: conn, r: br}, t.tlsConf)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, 0, err
		}
		tun = &tunnel{conn: tc, br: bufio.NewReaderSize(tc, 4096)}
	}
	_ = tun.conn.SetDeadline(time.Time{})
	return tun, time.Since(begin), nil
}

func (t *tunneler) connect(conn net.Conn, br *bufio.Reader) error {
	var b bytes.Buffer
	b.WriteString("CONNECT " + t.authority + " HTTP/1.1\r\nHost: " + t.authority + "\r\n")
	if t.proxyAuth != "" {
		b.WriteString("Proxy-Authorization: " + t.proxyAuth + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := conn.Write(b.Bytes()); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return &connectError{status: resp.StatusCode}
	}
	return nil
}

// do sends the request through the tunnel and reads the whole answer.
func (t *tunneler) do(tun *tunnel, deadline time.Time) outcome {
	_ = tun.conn.SetDeadline(deadline)
	if _, err := tun.conn.Write(t.request); err != nil {
		return outcome{class: ClassifyError(err)}
	}
	resp, err := http.ReadResponse(tun.br, &http.Request{Method: t.cfg.Method})
	if err != nil {
		return outcome{class: ClassifyError(err)}
	}
	o := outcome{class: ClassifyStatus(resp.StatusCode, resp.Header)}
	n, err := discard(resp.Body)
	resp.Body.Close()
	o.bytes = n
	if err != nil {
		o.class = ClassifyError(err)
	}
	// The target will close: the tunnel cannot carry another request.
	o.closed = resp.Close || o.class != ClassOK
	return o
}

// once is the connect-mode operation: a new tunnel, one request, close.
func (t *tunneler) once(ctx context.Context, _ int) outcome {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	tun, setup, err := t.open(ctx)
	if err != nil {
		return outcome{class: ClassifyError(err)}
	}
	defer tun.conn.Close()
	dl, _ := ctx.Deadline()
	o := t.do(tun, dl)
	o.setup = setup
	return o
}

// bufferedConn reads through r, which may hold bytes already read from
// Conn.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

var (
	_ net.Conn  = (*bufferedConn)(nil)
	_ io.Reader = (*countingReader)(nil)
)
