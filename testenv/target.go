package testenv

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	targetMaxBody     = 64 << 20 // bounds /bytes/N, /echo and any request body
	targetMaxReceived = 1000     // requests kept for Received
)

// Received describes one request as the target saw it; it is also the JSON
// body the target answers with.
type Received struct {
	Method        string            `json:"method"`
	Path          string            `json:"path"`
	Query         string            `json:"query"`
	Headers       map[string]string `json:"headers"`
	BodyBytes     int64             `json:"bodyBytes"`
	RemoteAddr    string            `json:"remoteAddr"`
	UpstreamProxy string            `json:"upstreamProxy"`
}

// Target is the origin server at the end of the proxy chain. It answers
// every request with a JSON description of it (see Received), except:
//
//	/bytes/N     N bytes of 'x' (N <= 64 MiB)
//	/echo        the request body
//	/status/CODE the JSON description with that status code
type Target struct {
	url    string
	addr   string
	srv    *http.Server
	served chan struct{}
	pool   *x509.CertPool // nil for plain HTTP
	client *http.Client

	count atomic.Int64

	mu       sync.Mutex
	sources  map[string]string // dial source IP -> upstream ID
	received []Received        // ring of the last targetMaxReceived
	next     int               // ring write position once full
}

// NewTarget starts a plain HTTP target on addr (default 127.0.0.1:0).
func NewTarget(addr string) (*Target, error) { return newTarget(addr, false) }

// NewTLSTarget starts an HTTPS target with a fresh self-signed certificate
// valid for 127.0.0.1, ::1 and localhost; trust it through CertPool or Client.
func NewTLSTarget(addr string) (*Target, error) { return newTarget(addr, true) }

func newTarget(addr string, useTLS bool) (*Target, error) {
	ln, err := listenLoopback(addr, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting target: %w", err)
	}
	t := &Target{
		addr:    ln.Addr().String(),
		served:  make(chan struct{}),
		sources: make(map[string]string),
	}
	transport := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	scheme := "http"
	if useTLS {
		cert, pool, err := selfSignedCert()
		if err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("starting target: %w", err)
		}
		// HTTP/1.1 only keeps what travels through a tunnel easy to reason about.
		ln = tls.NewListener(ln, &tls.Config{
			Certificates: []tls.Certificate{cert},
			NextProtos:   []string{"http/1.1"},
			MinVersion:   tls.VersionTLS12,
		})
		t.pool = pool
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	t.url = scheme + "://" + t.addr
	t.client = &http.Client{Transport: transport, Timeout: 30 * time.Second}
	t.srv = &http.Server{
		Handler:           t,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       60 * time.Second,
		// TLS handshakes from clients that distrust us would be logged.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(t.served)
		_ = t.srv.Serve(ln)
	}()
	return t, nil
}

// URL returns the base URL (http:// or https://).
func (t *Target) URL() string { return t.url }

// Addr returns host:port.
func (t *Target) Addr() string { return t.addr }

// CertPool returns a pool trusting a TLS target's certificate (nil if plain).
func (t *Target) CertPool() *x509.CertPool { return t.pool }

// Client returns a client that connects directly and trusts the target.
func (t *Target) Client() *http.Client { return t.client }

// Close stops the target, cutting in-flight requests.
func (t *Target) Close() error {
	err := t.srv.Close()
	<-t.served
	t.client.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("closing target: %w", err)
	}
	return nil
}

// MapSource tells the target that connections from ip come through the
// upstream proxy id; this is how it identifies proxies inside CONNECT
// tunnels, where no header can be added.
func (t *Target) MapSource(ip, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sources[ip] = id
}

// Learn maps the dial source of every proxy that has one.
func (t *Target) Learn(ups []*UpstreamProxy) {
	for _, up := range ups {
		if src := up.DialSource(); src != "" {
			t.MapSource(src, up.ID())
		}
	}
}

// Count returns the number of requests received.
func (t *Target) Count() int64 { return t.count.Load() }

// Received returns the most recent requests (at most 1000), oldest first.
func (t *Target) Received() []Received {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Received, 0, len(t.received))
	out = append(out, t.received[t.next:]...)
	return append(out, t.received[:t.next]...)
}

func (t *Target) record(rec Received) {
	t.count.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.received) < targetMaxReceived {
		t.received = append(t.received, rec)
		return
	}
	t.received[t.next] = rec
	t.next = (t.next + 1) % targetMaxReceived
}

func (t *Target) upstreamOf(r *http.Request) string {
	if id := r.Header.Get(UpstreamHeader); id != "" {
		return id
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sources[host]
}

func (t *Target) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Read the body before answering: HTTP/1 handlers may not read it after.
	var body bytes.Buffer
	sink := io.Discard
	if r.URL.Path == "/echo" {
		sink = &body
	}
	n, err := io.Copy(sink, io.LimitReader(r.Body, targetMaxBody+1))
	headers := make(map[string]string, len(r.Header)+1)
	for k, vs := range r.Header {
		headers[k] = strings.Join(vs, ", ")
	}
	headers["Host"] = r.Host
	rec := Received{
		Method:        r.Method,
		Path:          r.URL.Path,
		Query:         r.URL.RawQuery,
		Headers:       headers,
		BodyBytes:     n,
		RemoteAddr:    r.RemoteAddr,
		UpstreamProxy: t.upstreamOf(r),
	}
	t.record(rec)
	switch {
	case err != nil:
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
	case n > targetMaxBody:
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
	case r.URL.Path == "/echo":
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(body.Len()))
		_, _ = w.Write(body.Bytes())
	case strings.HasPrefix(r.URL.Path, "/bytes/"):
		writeBytes(w, strings.TrimPrefix(r.URL.Path, "/bytes/"))
	case strings.HasPrefix(r.URL.Path, "/status/"):
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if err != nil || code < 200 || code > 599 {
			http.Error(w, "status must be 200..599", http.StatusBadRequest)
			return
		}
		if code == http.StatusNoContent || code == http.StatusNotModified {
			w.WriteHeader(code) // these may not carry a body
			return
		}
		writeJSON(w, code, rec)
	default:
		writeJSON(w, http.StatusOK, rec)
	}
}

var xChunk = bytes.Repeat([]byte("x"), 32<<10)

func writeBytes(w http.ResponseWriter, arg string) {
	n, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || n < 0 || n > targetMaxBody {
		http.Error(w, fmt.Sprintf("byte count must be 0..%d", targetMaxBody), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	for n > 0 {
		k := min(n, int64(len(xChunk)))
		if _, err := w.Write(xChunk[:k]); err != nil {
			return
		}
		n -= k
	}
}

// selfSignedCert makes a throw-away certificate for loopback names.
func selfSignedCert() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("generating serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"proxypool testenv"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("creating certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("parsing certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}
