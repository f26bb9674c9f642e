package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultMaxScrapes bounds concurrent /metrics requests; gathering walks
// every collector, so a scrape storm must not pile up.
const DefaultMaxScrapes = 4

// OpsOptions configure NewOps.
type OpsOptions struct {
	Readiness Readiness
	// Gatherer is what /metrics serves, normally the process's
	// *prometheus.Registry (also passed as Registry).
	Gatherer prometheus.Gatherer
	// Registry receives this layer's own metrics; nil keeps them private.
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// MaxScrapes bounds concurrent /metrics requests; 0 means
	// DefaultMaxScrapes. Excess scrapes get 503 at once.
	MaxScrapes int
}

// OpsHandler serves /healthz, /readyz and /metrics, unauthenticated.
type OpsHandler struct {
	*surface
	ready   Readiness
	scrape  http.Handler
	scrapes chan struct{}
}

var opsRoutes = []route[*OpsHandler]{
	{routeSpec{http.MethodGet, "/healthz", []int{200}}, (*OpsHandler).healthz},
	{routeSpec{http.MethodGet, "/readyz", []int{200, 503}}, (*OpsHandler).readyz},
	{routeSpec{http.MethodGet, "/metrics", []int{200, 503}}, (*OpsHandler).serveMetrics},
}

// NewOps builds the ops handler for the admin (and metrics) listener.
func NewOps(o OpsOptions) (*OpsHandler, error) {
	if o.Readiness == nil || o.Gatherer == nil {
		return nil, errors.New("building ops endpoints: Readiness and Gatherer are required")
	}
	s, err := newSurface(surfaceOps, false, o.Registry, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("building ops endpoints: %w", err)
	}
	n := o.MaxScrapes
	if n <= 0 {
		n = DefaultMaxScrapes
	}
	h := &OpsHandler{
		surface: s,
		ready:   o.Readiness,
		scrapes: make(chan struct{}, n),
		scrape: promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{
			// A failing collector must not hide every other metric.
			ErrorHandling: promhttp.ContinueOnError,
			ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}),
	}
	s.mux = newMux(h, opsRoutes)
	return h, nil
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// healthz answers while the process can serve HTTP at all: liveness, not
// readiness, so a restart is never triggered by a dependency outage.
func (*OpsHandler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

func (h *OpsHandler) readyz(w http.ResponseWriter, _ *http.Request) {
	if !h.ready.Ready() {
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ptUnavailable, "not ready"))
		return
	}
	writeText(w, http.StatusOK, "ready\n")
}

func (h *OpsHandler) serveMetrics(w http.ResponseWriter, r *http.Request) {
	select {
	case h.scrapes <- struct{}{}:
		defer func() { <-h.scrapes }()
	default:
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ptUnavailable, "too many concurrent scrapes"))
		return
	}
	// promhttp sets its own caching-neutral headers; metrics are not
	// secret, so the surface's no-store is harmless but not needed.
	h.scrape.ServeHTTP(w, r)
}

var _ http.Handler = (*OpsHandler)(nil)
