package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// DefaultRequestTimeout bounds one controller call made for a request. It
// is below the server's default WriteTimeout so the client gets a problem
// rather than a reset connection.
const DefaultRequestTimeout = 15 * time.Second

// Bounds of an extract request beyond count, so a filter cannot make the
// store do unbounded work.
const (
	maxFilterString    = 128
	maxFilterUpstreams = 64
	maxFilterSeconds   = 24 * 60 * 60
)

// HeaderIdempotencyKey and HeaderIdempotentReplayed carry extract
// idempotency.
const (
	HeaderIdempotencyKey     = "Idempotency-Key"
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// DistributionOptions configure NewDistribution.
type DistributionOptions struct {
	Extractor Extractor
	// Surface is config.Config.Distribution: auth, access, trusted
	// proxies and maxBodyBytes.
	Surface config.Surface
	// Extraction is config.Config.Extraction: maxCount caps count, and
	// minRemainingTTL / maxHealthCheckAge are floors a client can only
	// tighten; reserveForGateway and idempotencyTTL are passed through.
	Extraction config.Extraction
	// Timeout bounds the Extract call; 0 means DefaultRequestTimeout.
	Timeout time.Duration
	// Registry receives this layer's metrics; nil keeps them private.
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// Now is the clock for remainingTtlSeconds; nil means time.Now.
	Now func() time.Time
}

// DistributionHandler serves the distribution API.
type DistributionHandler struct {
	*surface
	ex      Extractor
	policy  atomic.Pointer[config.Extraction]
	timeout time.Duration
	now     func() time.Time
}

var distributionRoutes = []route[*DistributionHandler]{
	{routeSpec{http.MethodPost, "/v1/extract", []int{200, 400, 401, 403, 409, 413, 415, 422, 429, 500, 503}}, (*DistributionHandler).extract},
}

// NewDistribution builds the distribution API handler.
func NewDistribution(o DistributionOptions) (*DistributionHandler, error) {
	if o.Extractor == nil {
		return nil, errors.New("building distribution api: nil Extractor")
	}
	s, err := newSurface(surfaceDistribution, true, o.Registry, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("building distribution api: %w", err)
	}
	d := &DistributionHandler{surface: s, ex: o.Extractor, timeout: o.Timeout, now: o.Now}
	if d.timeout <= 0 {
		d.timeout = DefaultRequestTimeout
	}
	if d.now == nil {
		d.now = time.Now
	}
	if err := d.Reconfigure(o.Surface, o.Extraction); err != nil {
		return nil, fmt.Errorf("building distribution api: %w", err)
	}
	s.mux = newMux(d, distributionRoutes)
	return d, nil
}

// Reconfigure swaps auth, access, body bound and extraction policy; on
// error the previous configuration stays in force. Reload calls it after
// the new config validated.
func (d *DistributionHandler) Reconfigure(s config.Surface, e config.Extraction) error {
	if e.MaxCount <= 0 {
		e.MaxCount = config.DefaultMaxExtractCount
	}
	e.MaxCount = min(e.MaxCount, extraction.MaxCount)
	if err := d.configure(s); err != nil {
		return err
	}
	d.policy.Store(&e)
	return nil
}

// applyPolicy fills what the operator decides: a client may ask for
// fresher or longer-lived proxies than the configured floors, never for
// worse ones.
func applyPolicy(req *extraction.Request, e *config.Extraction) {
	req.Filters.MinRemainingTTL = max(req.Filters.MinRemainingTTL, e.MinRemainingTTL)
	if e.MaxHealthCheckAge > 0 && (req.Filters.MaxHealthCheckAge == 0 || req.Filters.MaxHealthCheckAge > e.MaxHealthCheckAge) {
		req.Filters.MaxHealthCheckAge = e.MaxHealthCheckAge
	}
	req.ReserveForGateway = e.ReserveForGateway
	req.IdempotencyTTL = e.IdempotencyTTL
}

// extractBody is the JSON request of POST /v1/extract.
type extractBody struct {
	Count       int            `json:"count"`
	Filters     extractFilters `json:"filters"`
	Fulfillment string         `json:"fulfillment"`
}

type extractFilters struct {
	Protocol                 string   `json:"protocol"`
	Region                   string   `json:"region"`
	Carrier                  string   `json:"carrier"`
	Upstreams                []string `json:"upstreams"`
	MinRemainingTTLSeconds   int64    `json:"minRemainingTTLSeconds"`
	MaxHealthCheckAgeSeconds int64    `json:"maxHealthCheckAgeSeconds"`
}

// decodeExtractRequest parses and validates an extract body. Every error
// is a *badRequest except an oversize body (*http.MaxBytesError).
func decodeExtractRequest(r io.Reader, maxCount int) (extraction.Request, error) {
	var b extractBody
	if err := decodeStrict(r, &b); err != nil {
		return extraction.Request{}, err
	}
	f := b.Filters
	for _, s := range []struct {
		name, v string
	}{{"filters.protocol", f.Protocol}, {"filters.region", f.Region}, {"filters.carrier", f.Carrier}} {
		if len(s.v) > maxFilterString {
			return extraction.Request{}, errBadRequest(fmt.Sprintf("%s longer than %d bytes", s.name, maxFilterString))
		}
	}
	if len(f.Upstreams) > maxFilterUpstreams {
		return extraction.Request{}, errBadRequest(fmt.Sprintf("filters.upstreams has more than %d entries", maxFilterUpstreams))
	}
	for i, u := range f.Upstreams {
		if u == "" || len(u) > maxFilterString {
			return extraction.Request{}, errBadRequest(fmt.Sprintf("filters.upstreams[%d] must be 1 to %d bytes", i, maxFilterString))
		}
	}
	for _, s := range []struct {
		name string
		v    int64
	}{{"filters.minRemainingTTLSeconds", f.MinRemainingTTLSeconds}, {"filters.maxHealthCheckAgeSeconds", f.MaxHealthCheckAgeSeconds}} {
		if s.v < 0 || s.v > maxFilterSeconds {
			return extraction.Request{}, errBadRequest(fmt.Sprintf("%s must be between 0 and %d", s.name, maxFilterSeconds))
		}
	}
	req := extraction.Request{
		Count: b.Count,
		Filters: extraction.Filters{
			Protocol:          proxy.Scheme(f.Protocol),
			Region:            f.Region,
			Carrier:           f.Carrier,
			Upstreams:         f.Upstreams,
			MinRemainingTTL:   time.Duration(f.MinRemainingTTLSeconds) * time.Second,
			MaxHealthCheckAge: time.Duration(f.MaxHealthCheckAgeSeconds) * time.Second,
		},
		Fulfillment: extraction.Fulfillment(b.Fulfillment),
	}
	if req.Fulfillment == "" {
		req.Fulfillment = extraction.Partial
	}
	if err := req.Validate(); err != nil {
		return extraction.Request{}, errBadRequest(err.Error())
	}
	if req.Count > maxCount {
		return extraction.Request{}, errBadRequest(fmt.Sprintf("count must be at most %d (extraction.maxCount), got %d", maxCount, req.Count))
	}
	return req, nil
}

// extractResponse is the 200 answer of POST /v1/extract.
type extractResponse struct {
	Requested int         `json:"requested"`
	Returned  int         `json:"returned"`
	Proxies   []proxyJSON `json:"proxies"`
}

// proxyJSON is an extracted proxy, credentials included: the client now
// owns it (seed 000 §15: raw mode, documented as such).
type proxyJSON struct {
	URL                 string    `json:"url"`
	Scheme              string    `json:"scheme"`
	Host                string    `json:"host"`
	Port                uint16    `json:"port"`
	Username            string    `json:"username"`
	Password            string    `json:"password"`
	ExpiresAt           time.Time `json:"expiresAt"`
	RemainingTTLSeconds int64     `json:"remainingTtlSeconds"`
	Protocol            string    `json:"protocol"`
	Region              string    `json:"region"`
	Carrier             string    `json:"carrier"`
	Upstream            string    `json:"upstream"`
}

func (d *DistributionHandler) extract(w http.ResponseWriter, r *http.Request) {
	if p := requireJSON(r); p != nil {
		writeProblem(w, p)
		return
	}
	pol := d.policy.Load()
	req, err := decodeExtractRequest(r.Body, pol.MaxCount)
	if err == nil && len(r.Header.Values(HeaderIdempotencyKey)) > 1 {
		err = errBadRequest("more than one " + HeaderIdempotencyKey + " header")
	}
	if err == nil {
		req.IdempotencyKey = r.Header.Get(HeaderIdempotencyKey)
		req.Client = principalOf(r.Context()).Name
		applyPolicy(&req, pol)
		if verr := req.Validate(); verr != nil {
			err = errBadRequest(verr.Error())
		}
	}
	if err != nil {
		writeProblem(w, problemFor(d.log, "decode extract", err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), d.timeout)
	defer cancel()
	res, err := d.ex.Extract(ctx, req)
	if err != nil {
		p := problemFor(d.log, "extract", err)
		if p.Status == http.StatusConflict && p.Requested == nil {
			n := req.Count
			p.Requested = &n
		}
		writeProblem(w, p)
		return
	}
	now := d.now()
	out := extractResponse{Requested: res.Requested, Returned: len(res.Proxies), Proxies: make([]proxyJSON, 0, len(res.Proxies))}
	if out.Requested == 0 {
		out.Requested = req.Count
	}
	for i := range res.Proxies {
		p := &res.Proxies[i]
		out.Proxies = append(out.Proxies, proxyJSON{
			URL:                 proxyURL(p),
			Scheme:              string(p.Key.Scheme),
			Host:                p.Key.Host,
			Port:                p.Key.Port,
			Username:            p.Key.Username,
			Password:            p.Password,
			ExpiresAt:           p.ExpiresAt.UTC(),
			RemainingTTLSeconds: int64(p.RemainingTTL(now) / time.Second),
			Protocol:            string(p.Key.Scheme),
			Region:              p.Region,
			Carrier:             p.Carrier,
			Upstream:            p.Upstream,
		})
	}
	if res.Replayed {
		w.Header().Set(HeaderIdempotentReplayed, "true")
	}
	writeJSON(w, http.StatusOK, out)
}

// proxyURL renders the proxy with percent-encoded credentials; vendors
// hand out passwords containing '@', ':' or '/', which a plain
// concatenation would turn into a different URL.
func proxyURL(p *proxy.Proxy) string {
	u := url.URL{Scheme: string(p.Key.Scheme), Host: p.Addr()}
	switch {
	case p.Key.Username != "" && p.Password != "":
		u.User = url.UserPassword(p.Key.Username, p.Password)
	case p.Key.Username != "":
		u.User = url.User(p.Key.Username)
	}
	return u.String()
}

var _ http.Handler = (*DistributionHandler)(nil)
