package ingress

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/relay"
)

type methodClass uint8

const (
	classConnect methodClass = iota
	classGetHead
	classOther
	numClasses
)

var classNames = [numClasses]string{"connect", "get_head", "other"}

func classOf(method string) methodClass {
	switch method {
	case "CONNECT":
		return classConnect
	case "GET", "HEAD":
		return classGetHead
	}
	return classOther
}

type result uint8

const (
	resultOK result = iota
	resultRejected
	resultBadRequest
	resultUpstreamError
	resultCanceled
	numResults
)

var resultNames = [numResults]string{"ok", "rejected", "bad_request", "upstream_error", "canceled"}

// Rejection reasons: the X-Proxypool-Reason header value and the reason
// label of proxypool_gateway_rejections_total.
const (
	ReasonNoProxy           = "no-proxy"
	ReasonStale             = "stale"
	ReasonNoRoute           = "no-route"
	ReasonDeniedDestination = "denied-destination"
	ReasonAccessDenied      = "access-denied"
	ReasonAuthRequired      = "auth-required"
	ReasonBadTarget         = "bad-target"
	ReasonTooManyHeaders    = "too-many-headers"
	ReasonOverload          = "overload"
	ReasonTooManyConns      = "too-many-connections"
	ReasonRateLimited       = "rate-limited"
	ReasonRoutingLimit      = "routing-limit"
	ReasonBadFraming        = "bad-framing"
	ReasonBadRequest        = "bad-request"
	ReasonHeadersTooLarge   = "headers-too-large"
)

var rejectionReasons = []string{
	ReasonNoProxy, ReasonStale, ReasonNoRoute, ReasonDeniedDestination, ReasonAccessDenied,
	ReasonAuthRequired, ReasonBadTarget, ReasonTooManyHeaders, ReasonOverload,
	ReasonTooManyConns, ReasonRateLimited, ReasonRoutingLimit, ReasonBadFraming,
	ReasonBadRequest, ReasonHeadersTooLarge,
}

type metrics struct {
	requests      [numClasses][numResults]prometheus.Counter
	duration      [numClasses]prometheus.Observer
	tunnelsActive prometheus.Gauge
	bytesUp       prometheus.Counter
	bytesDown     prometheus.Counter
	retries       prometheus.Counter
	rejections    map[string]prometheus.Counter

	connsActive      prometheus.Gauge
	connsAccepted    prometheus.Counter
	upstreamConnect  prometheus.Observer
	upstreamFailures [worker.PhaseTunnel + 1]prometheus.Counter
	direct           prometheus.Counter
}

const ns, sub = "proxypool", "gateway"

func newMetrics(reg prometheus.Registerer) *metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "Client requests by method class and result.",
	}, []string{"method_class", "result"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
		Help:    "Client request duration, tunnels included, by method class.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"method_class"})
	tunnels := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "connect_tunnels_active",
		Help: "CONNECT tunnels currently open.",
	})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bytes_total",
		Help: "Payload bytes carried: upstream is client to target, downstream target to client.",
	}, []string{"direction"})
	retries := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "retries_total",
		Help: "Requests retried on another proxy.",
	})
	rejections := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "rejections_total",
		Help: "Requests and connections refused by the gateway, by reason.",
	}, []string{"reason"})
	connsActive := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "client_connections_active",
		Help: "Client connections currently open (tunnels included).",
	})
	connsAccepted := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "client_connections_total",
		Help: "Client connections accepted (refused ones count in rejections_total).",
	})
	upConnect := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "upstream_connect_duration_seconds",
		Help:    "Time from choosing a proxy to the upstream's response headers or CONNECT 2xx (successful attempts).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	upFailures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "upstream_failures_total",
		Help: "Failed upstream attempts by phase (dial, proxy_handshake, response_headers, tunnel).",
	}, []string{"phase"})
	direct := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "direct_requests_total",
		Help: "Requests and tunnels of onUnavailable direct routings served without a proxy.",
	})
	m := &metrics{
		connsActive:     connsActive,
		connsAccepted:   connsAccepted,
		upstreamConnect: upConnect,
		direct:          direct,
		tunnelsActive:   tunnels,
		bytesUp:         bytes.WithLabelValues("upstream"),
		bytesDown:       bytes.WithLabelValues("downstream"),
		retries:         retries,
		rejections:      make(map[string]prometheus.Counter, len(rejectionReasons)),
	}
	for c := range numClasses {
		m.duration[c] = duration.WithLabelValues(classNames[c])
		for r := range numResults {
			m.requests[c][r] = requests.WithLabelValues(classNames[c], resultNames[r])
		}
	}
	for _, r := range rejectionReasons {
		m.rejections[r] = rejections.WithLabelValues(r)
	}
	for ph := worker.PhaseNone; ph <= worker.PhaseTunnel; ph++ {
		m.upstreamFailures[ph] = upFailures.WithLabelValues(ph.String())
	}
	if reg != nil {
		reg.MustRegister(requests, duration, tunnels, bytes, retries, rejections,
			connsActive, connsAccepted, upConnect, upFailures, direct)
		reg.MustRegister(relayCollectors()...)
	}
	return m
}

// relayCollectors report the process's two tunnel copy pools, summed.
func relayCollectors() []prometheus.Collector {
	stats := func(f func(relay.Stats) float64) func() float64 {
		return func() float64 { return f(bufferRelay.Stats()) + f(spliceRelay.Stats()) }
	}
	gauge := func(name, help string, f func(relay.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, stats(f))
	}
	counter := func(name, help string, f func(relay.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, stats(f))
	}
	return []prometheus.Collector{
		gauge("relay_large_buffers", "Large tunnel copy buffers allocated, in use or idle (bounded by the relay).",
			func(s relay.Stats) float64 { return float64(s.LargeLive) }),
		gauge("relay_large_buffers_idle", "Large tunnel copy buffers waiting for a bulk burst.",
			func(s relay.Stats) float64 { return float64(s.LargeIdle) }),
		counter("relay_large_buffer_misses_total", "Bulk tunnel bursts copied through a small buffer because every large one was in use.",
			func(s relay.Stats) float64 { return float64(s.LargeMisses) }),
		gauge("relay_pipes", "Splice pipes open, in use or idle (gateway.tunnelSplice).",
			func(s relay.Stats) float64 { return float64(s.Live) }),
		gauge("relay_pipes_idle", "Splice pipes waiting for a burst.",
			func(s relay.Stats) float64 { return float64(s.Idle) }),
		counter("relay_pipe_fallbacks_total", "Tunnel bursts copied through a buffer because no splice pipe could be had.",
			func(s relay.Stats) float64 { return float64(s.Fallbacks) }),
		counter("relay_pipes_discarded_total", "Splice pipes closed because a copy failed with data in them.",
			func(s relay.Stats) float64 { return float64(s.Discarded) }),
	}
}
