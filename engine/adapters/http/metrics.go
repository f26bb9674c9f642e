package httpapi

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// routeUnmatched labels requests no pattern matched, so scanners probing
// random paths cannot grow the label set.
const routeUnmatched = "unmatched"

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newMetrics registers the collectors on reg, or reuses the ones already
// there: the three surfaces share a registry and each constructor calls
// this.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	req := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "proxypool", Subsystem: "api", Name: "requests_total",
		Help: "REST API requests by surface, route pattern and status code.",
	}, []string{"surface", "route", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "proxypool", Subsystem: "api", Name: "request_duration_seconds",
		Help:    "REST API request latency by surface and route pattern.",
		Buckets: prometheus.DefBuckets,
	}, []string{"surface", "route"})
	var err error
	if req, err = registerOrReuse(reg, req); err != nil {
		return nil, err
	}
	if dur, err = registerOrReuse(reg, dur); err != nil {
		return nil, err
	}
	return &metrics{requests: req, duration: dur}, nil
}

func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, err
	}
	return c, nil
}

func (m *metrics) observe(surface, route string, code int, d time.Duration) {
	m.requests.WithLabelValues(surface, route, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(surface, route).Observe(d.Seconds())
}
