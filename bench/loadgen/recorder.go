package loadgen

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// recorderShards spreads workers over this many histograms, so recording
// takes an uncontended lock while memory stays bounded (about 150 KB per
// histogram) however many workers or tunnels there are.
const recorderShards = 64

// Recorder collects latencies into HdrHistograms (3 significant digits,
// microsecond resolution). Values above the trackable ceiling are clamped
// to it; the true maximum is kept separately.
type Recorder struct {
	ceiling int64 // µs
	shards  [recorderShards]struct {
		mu  sync.Mutex
		h   *hdrhistogram.Histogram
		max int64
		_   [40]byte // keep shards on separate cache lines
	}
}

// NewRecorder tracks latencies up to ceiling (at least one second).
func NewRecorder(ceiling time.Duration) *Recorder {
	c := max(ceiling.Microseconds(), int64(time.Second/time.Microsecond))
	r := &Recorder{ceiling: c}
	for i := range r.shards {
		r.shards[i].h = hdrhistogram.New(1, c, 3)
	}
	return r
}

// Record adds one latency; shard is any number stable per worker.
func (r *Recorder) Record(shard int, d time.Duration) {
	us := max(d.Microseconds(), 1)
	s := &r.shards[uint(shard)%recorderShards]
	s.mu.Lock()
	s.max = max(s.max, us)
	// RecordValue only fails above the ceiling, which min rules out.
	_ = s.h.RecordValue(min(us, r.ceiling))
	s.mu.Unlock()
}

// Quantiles merges the shards and reads the figures.
func (r *Recorder) Quantiles() Quantiles {
	all := hdrhistogram.New(1, r.ceiling, 3)
	var top int64
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		all.Merge(s.h)
		top = max(top, s.max)
		s.mu.Unlock()
	}
	return quantilesOf(all, top)
}

// Quantiles are latency figures in milliseconds. Each quantile is the
// histogram's upper bound for that rank (within 0.1%); Max is exact.
type Quantiles struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

func quantilesOf(h *hdrhistogram.Histogram, maxUS int64) Quantiles {
	if h.TotalCount() == 0 {
		return Quantiles{}
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return Quantiles{
		Count: h.TotalCount(),
		Mean:  h.Mean() / 1000,
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(maxUS),
	}
}
