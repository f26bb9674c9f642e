package testenv

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// VendorMode selects how the simulated vendor answers; see SetMode.
type VendorMode int32

const (
	// VendorNormal serves proxies from the configured list, rotating.
	VendorNormal VendorMode = iota
	// VendorEmpty answers 200 with an empty list (or empty text body).
	VendorEmpty
	// VendorError500 answers 500.
	VendorError500
	// VendorRateLimited answers 429 with Retry-After: 2.
	VendorRateLimited
	// VendorSlow waits VendorConfig.SlowDelay, then answers normally.
	VendorSlow
	// VendorMalformed answers 200 with broken JSON or garbage text.
	VendorMalformed
	// VendorDuplicateOnly repeats the first batch ever served, byte for byte.
	VendorDuplicateOnly
	// VendorAuthRequired answers 401 whatever credentials are sent.
	VendorAuthRequired
)

var vendorModeNames = [...]string{"normal", "empty", "error500", "rate-limited", "slow", "malformed", "duplicate-only", "auth-required"}

func (m VendorMode) String() string {
	if m >= 0 && int(m) < len(vendorModeNames) {
		return vendorModeNames[m]
	}
	return "VendorMode(" + strconv.Itoa(int(m)) + ")"
}

// VendorProxy is one proxy the vendor hands out.
type VendorProxy struct {
	Host               string
	Port               int
	Username, Password string
	Region, Carrier    string
}

// VendorConfig configures NewVendor. Zero values get the documented defaults.
type VendorConfig struct {
	Addr      string        // listen address; default 127.0.0.1:0
	Proxies   []VendorProxy // list served in rotation
	TTL       time.Duration // lifetime announced per proxy; default 10m
	APIKey    string        // if set, required as ?key= or X-Api-Key
	SlowDelay time.Duration // delay in VendorSlow; default 5s
}

const (
	vendorDefaultCount = 10
	vendorMaxCount     = 1000
)

// Vendor is a simulated proxy vendor API:
//
//	GET /v1/proxies?count=N&format=json|text
type Vendor struct {
	cfg    VendorConfig
	url    string
	srv    *http.Server
	served chan struct{}

	mode  atomic.Int32
	calls atomic.Int64

	mu      sync.Mutex
	proxies []VendorProxy
	next    int           // rotation cursor into proxies
	first   []vendorEntry // first batch ever served, for VendorDuplicateOnly
}

// vendorEntry is a proxy as served, with its expiry fixed at serving time so
// that VendorDuplicateOnly can repeat it exactly.
type vendorEntry struct {
	VendorProxy
	expireAt time.Time
}

// NewVendor starts the vendor API on a loopback address.
func NewVendor(cfg VendorConfig) (*Vendor, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Minute
	}
	if cfg.SlowDelay <= 0 {
		cfg.SlowDelay = 5 * time.Second
	}
	ln, err := listenLoopback(cfg.Addr, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting vendor: %w", err)
	}
	v := &Vendor{
		cfg:     cfg,
		url:     "http://" + ln.Addr().String(),
		served:  make(chan struct{}),
		proxies: append([]VendorProxy(nil), cfg.Proxies...),
	}
	v.srv = &http.Server{
		Handler:           v,
		ReadHeaderTimeout: 5 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       60 * time.Second,
	}
	go func() {
		defer close(v.served)
		_ = v.srv.Serve(ln)
	}()
	return v, nil
}

// URL returns the base URL, http://127.0.0.1:P.
func (v *Vendor) URL() string { return v.url }

// Close stops the server, cutting in-flight requests (slow ones included).
func (v *Vendor) Close() error {
	err := v.srv.Close()
	<-v.served
	if err != nil {
		return fmt.Errorf("closing vendor: %w", err)
	}
	return nil
}

// SetMode switches how subsequent requests are answered.
func (v *Vendor) SetMode(m VendorMode) { v.mode.Store(int32(m)) }

// Mode returns the current mode.
func (v *Vendor) Mode() VendorMode { return VendorMode(v.mode.Load()) }

// SetProxies replaces the served list and restarts rotation and duplicates.
func (v *Vendor) SetProxies(proxies []VendorProxy) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.proxies = append([]VendorProxy(nil), proxies...)
	v.next = 0
	v.first = nil
}

// Calls returns the number of requests received, whatever their outcome.
func (v *Vendor) Calls() int64 { return v.calls.Load() }

func (v *Vendor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v.calls.Add(1)
	if r.URL.Path != "/v1/proxies" {
		writeVendorError(w, http.StatusNotFound, "not found")
		return
	}
	if r.Method != http.MethodGet {
		writeVendorError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	mode := v.Mode()
	if mode == VendorAuthRequired || !v.authorized(r) {
		writeVendorError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	q := r.URL.Query()
	format := q.Get("format")
	if format == "" {
		format = "json"
	}
	if format != "json" && format != "text" {
		writeVendorError(w, http.StatusBadRequest, "format must be json or text")
		return
	}
	count := vendorDefaultCount
	if s := q.Get("count"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeVendorError(w, http.StatusBadRequest, "count must be a positive integer")
			return
		}
		count = min(n, vendorMaxCount)
	}

	switch mode {
	case VendorError500:
		writeVendorError(w, http.StatusInternalServerError, "internal error")
		return
	case VendorRateLimited:
		w.Header().Set("Retry-After", "2")
		writeVendorError(w, http.StatusTooManyRequests, "too many requests")
		return
	case VendorMalformed:
		writeMalformed(w, format)
		return
	case VendorSlow:
		timer := time.NewTimer(v.cfg.SlowDelay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-r.Context().Done():
			return // client gave up or the vendor is closing
		}
	}

	var batch []vendorEntry
	if mode != VendorEmpty {
		batch = v.batch(count, mode == VendorDuplicateOnly)
	}
	if format == "text" {
		writeVendorText(w, batch)
		return
	}
	writeVendorJSON(w, batch, v.cfg.TTL)
}

func (v *Vendor) authorized(r *http.Request) bool {
	if v.cfg.APIKey == "" {
		return true
	}
	key := r.URL.Query().Get("key")
	if key == "" {
		key = r.Header.Get("X-Api-Key")
	}
	return subtle.ConstantTimeCompare([]byte(key), []byte(v.cfg.APIKey)) == 1
}

// batch returns up to count proxies, continuing the rotation, or the first
// batch ever served when duplicate is set.
func (v *Vendor) batch(count int, duplicate bool) []vendorEntry {
	v.mu.Lock()
	defer v.mu.Unlock()
	if duplicate && v.first != nil {
		return v.first
	}
	n := min(count, len(v.proxies))
	if n == 0 {
		return nil
	}
	expireAt := time.Now().Add(v.cfg.TTL).UTC().Truncate(time.Second)
	out := make([]vendorEntry, n)
	for i := range out {
		out[i] = vendorEntry{VendorProxy: v.proxies[v.next], expireAt: expireAt}
		v.next = (v.next + 1) % len(v.proxies)
	}
	if v.first == nil {
		v.first = out
	}
	return out
}

type vendorResponse struct {
	Code int         `json:"code"`
	Msg  string      `json:"msg"`
	Data *vendorData `json:"data,omitempty"`
}

type vendorData struct {
	List []vendorItem `json:"list"`
}

type vendorItem struct {
	IP       string `json:"ip"`
	Port     int    `json:"port"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	TTL      int64  `json:"ttl"`
	ExpireAt string `json:"expire_at"`
	Region   string `json:"region"`
	Carrier  string `json:"carrier"`
}

func writeVendorJSON(w http.ResponseWriter, batch []vendorEntry, ttl time.Duration) {
	list := make([]vendorItem, 0, len(batch)) // non-nil: an empty list is [] not null
	for _, e := range batch {
		list = append(list, vendorItem{
			IP: e.Host, Port: e.Port,
			Username: e.Username, Password: e.Password,
			TTL:      int64(ttl / time.Second),
			ExpireAt: e.expireAt.Format(time.RFC3339),
			Region:   e.Region, Carrier: e.Carrier,
		})
	}
	writeJSON(w, http.StatusOK, vendorResponse{Code: 0, Msg: "ok", Data: &vendorData{List: list}})
}

func writeVendorText(w http.ResponseWriter, batch []vendorEntry) {
	var b strings.Builder
	for _, e := range batch {
		b.WriteString(net.JoinHostPort(e.Host, strconv.Itoa(e.Port)))
		if e.Username != "" || e.Password != "" {
			b.WriteString(":" + e.Username + ":" + e.Password)
		}
		b.WriteByte('\n')
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

func writeMalformed(w http.ResponseWriter, format string) {
	if format == "text" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("<html>oops</html>\nnot-a-proxy\n127.0.0.1:notaport\n:::\n"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"code":0,"msg":"ok","data":{"list":[{"ip":"127.0.0.1","port":`))
}

func writeVendorError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, vendorResponse{Code: status, Msg: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
