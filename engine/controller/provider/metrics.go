package provider

import "github.com/prometheus/client_golang/prometheus"

// Metrics are shared by every runtime of a supervisor. The upstream label
// is a configured name: low cardinality.
type Metrics struct {
	fetches    *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	fetched    *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	backoff    *prometheus.GaugeVec
	http429    *prometheus.CounterVec
	leader     *prometheus.GaugeVec
}

// NewMetrics creates the provider metrics and registers them on reg (nil:
// unregistered, for tests).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "fetch_total",
			Help: "Provider calls by outcome class (success, empty, duplicate_only, error).",
		}, []string{"upstream", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "fetch_duration_seconds",
			Help:    "Provider call latency, request to parsed answer.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 10),
		}, []string{"upstream"}),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "fetched_proxies_total",
			Help: "Valid proxy candidates returned by the provider.",
		}, []string{"upstream"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "duplicates_total",
			Help: "Valid candidates that were already in the pool.",
		}, []string{"upstream"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "rejected_candidates_total",
			Help: "Candidates refused as invalid, expired or pointing at a denied address.",
		}, []string{"upstream"}),
		backoff: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "backoff_seconds",
			Help: "Current backoff before the next provider call.",
		}, []string{"upstream"}),
		http429: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "http_429_total",
			Help: "Provider answers with status 429.",
		}, []string{"upstream"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "provider", Name: "leader",
			Help: "1 while this controller holds the upstream's fetch leadership (cluster storage).",
		}, []string{"upstream"}),
	}
	if reg != nil {
		reg.MustRegister(m.fetches, m.duration, m.fetched, m.duplicates, m.rejected, m.backoff, m.http429, m.leader)
	}
	return m
}

// forget drops an upstream's series when it leaves the configuration.
func (m *Metrics) forget(name string) {
	for _, v := range []*prometheus.CounterVec{m.fetched, m.duplicates, m.rejected, m.http429} {
		v.DeleteLabelValues(name)
	}
	m.fetches.DeletePartialMatch(prometheus.Labels{"upstream": name})
	m.duration.DeleteLabelValues(name)
	m.backoff.DeleteLabelValues(name)
	m.leader.DeleteLabelValues(name)
}
