package checker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Priority orders the check queue.
type Priority uint8

// Priorities: new (CHECKING) and SUSPECT proxies go first; ordinary
// rechecks of AVAILABLE proxies are the first to be shed under backlog.
const (
	PriorityHigh Priority = iota + 1
	PriorityNormal
)

func (p Priority) String() string {
	if p == PriorityHigh {
		return "high"
	}
	return "normal"
}

// ErrQueueFull is returned when a task could not be queued. A normal task
// is dropped; a high one is refused so its caller can retry later.
var ErrQueueFull = errors.New("check queue full")

// Executor runs one check; *Checker implements it, and so does a remote
// checker client in a cluster.
type Executor interface {
	Check(ctx context.Context, t Task) Observation
}

// Scheduler defaults.
const (
	DefaultMaxInFlight = 64
	DefaultQueueSize   = 4096
)

// SchedulerOptions configures a Scheduler.
type SchedulerOptions struct {
	Executor    Executor
	MaxInFlight int // concurrent checks; default DefaultMaxInFlight
	QueueSize   int // queued tasks across both priorities; default DefaultQueueSize
	// Report receives every observation, from the check's goroutine. It
	// must not block for long: it holds an in-flight slot.
	Report   func(Observation)
	Registry *prometheus.Registry
	// MaxPerSecond bounds the checks started per second (0: no bound).
	MaxPerSecond float64
	// Now is the clock of that bound; nil means time.Now.
	Now func() time.Time
}

// Stats is a point-in-time view of the scheduler.
type Stats struct {
	QueuedHigh, QueuedNormal int
	InFlight                 int
	Dropped, Refused         int64
	// QueueSize and MaxInFlight are the bounds in force.
	QueueSize, MaxInFlight int
}

// Backlogged reports whether checks are waiting for longer than they
// should: a new or SUSPECT proxy is queued, or the queue is half full.
// Planners then slow ordinary rechecks (seed 000 §18 "Checker 积压").
func (st Stats) Backlogged() bool {
	return st.QueuedHigh > 0 || st.QueuedHigh+st.QueuedNormal >= max(st.QueueSize/2, 1)
}

// Scheduler runs checks with bounded concurrency from a bounded queue. A
// proxy has at most one task per Key queued or running at a time.
type Scheduler struct {
	exec      Executor
	report    func(Observation)
	queueSize int
	wake      chan struct{}
	m         *schedMetrics

	// rate paces starts (MaxPerSecond); rest waits out its delays, or
	// until rateChanged (a reload) or ctx ends, and is replaced by tests.
	rate        *rate.Limiter
	now         func() time.Time
	rest        func(ctx context.Context, d time.Duration, changed <-chan struct{}) restEnd
	rateChanged chan struct{}

	mu       sync.Mutex
	limit    int
	high     []Task
	normal   []Task
	pending  map[Key]bool
	perProxy map[proxy.ID]int
	running  int
	dropped  int64
	refused  int64
}

// NewScheduler returns a Scheduler; Run starts it.
func NewScheduler(o SchedulerOptions) *Scheduler {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Report == nil {
		o.Report = func(Observation) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Scheduler{
		exec:        o.Executor,
		report:      o.Report,
		rate:        rate.NewLimiter(checkRate(o.MaxPerSecond), checkBurst(o.MaxPerSecond)),
		now:         o.Now,
		rest:        restFor,
		rateChanged: make(chan struct{}, 1),
		limit:       o.MaxInFlight,
		queueSize:   o.QueueSize,
		wake:        make(chan struct{}, 1),
		m:           newSchedMetrics(o.Registry),
		pending:     make(map[Key]bool),
		perProxy:    make(map[proxy.ID]int),
	}
}

// SetMaxInFlight changes the concurrency bound (reload). A lower bound
// lets running checks finish and starts no new one until below it.
func (s *Scheduler) SetMaxInFlight(n int) {
	if n <= 0 {
		n = DefaultMaxInFlight
	}
	s.mu.Lock()
	s.limit = n
	s.mu.Unlock()
	s.poke()
}

// SetMaxPerSecond changes the bound on checks started per second
// (reload); 0 removes it.
func (s *Scheduler) SetMaxPerSecond(r float64) {
	now := s.now()
	s.rate.SetLimitAt(now, checkRate(r))
	s.rate.SetBurstAt(now, checkBurst(r))
	select { // a start waiting at the old rate re-reserves at the new one
	case s.rateChanged <- struct{}{}:
	default:
	}
}

func checkRate(r float64) rate.Limit {
	if r <= 0 {
		return rate.Inf
	}
	return rate.Limit(r)
}

// checkBurst lets a twentieth of a second's checks start at once.
func checkBurst(r float64) int { return max(1, int(r/20)) }

// restEnd is why a rest ended.
type restEnd int

const (
	restDone     restEnd = iota // the delay passed
	restCanceled                // ctx ended
	restChanged                 // the bound was reloaded
)

func restFor(ctx context.Context, d time.Duration, changed <-chan struct{}) restEnd {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return restCanceled
	case <-changed:
		return restChanged
	case <-t.C:
		return restDone
	}
}

// pace waits until the bound on checks per second lets one more start;
// false when ctx ended first.
func (s *Scheduler) pace(ctx context.Context) bool {
	for {
		now := s.now()
		r := s.rate.ReserveN(now, 1)
		d := r.DelayFrom(now)
		if d <= 0 {
			return true
		}
		switch s.rest(ctx, d, s.rateChanged) {
		case restDone:
			return true
		case restCanceled:
			r.CancelAt(s.now())
			return false
		}
		r.CancelAt(s.now()) // reloaded: reserve again at the new rate
	}
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Submit queues t. A task whose Key is already queued or running is
// coalesced (nil). When the queue is full a normal task is dropped and a
// high one evicts the oldest normal task, or is refused when there is
// none; both return ErrQueueFull and are counted.
func (s *Scheduler) Submit(t Task) error {
	if t.Priority == 0 {
		t.Priority = PriorityNormal
	}
	k := t.Key()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[k] {
		return nil
	}
	if len(s.high)+len(s.normal) >= s.queueSize {
		if t.Priority == PriorityNormal || len(s.normal) == 0 {
			s.countRejected(t.Priority)
			return ErrQueueFull
		}
		evicted := s.normal[0]
		s.normal[0] = Task{}
		s.normal = s.normal[1:]
		s.unpendLocked(evicted.Key())
		s.countRejected(PriorityNormal)
	}
	if t.Priority == PriorityHigh {
		s.high = append(s.high, t)
	} else {
		s.normal = append(s.normal, t)
	}
	s.pending[k] = true
	s.perProxy[k.ID]++
	s.gauges()
	s.poke()
	return nil
}

func (s *Scheduler) unpendLocked(k Key) {
	if !s.pending[k] {
		return
	}
	delete(s.pending, k)
	if s.perProxy[k.ID] <= 1 {
		delete(s.perProxy, k.ID)
	} else {
		s.perProxy[k.ID]--
	}
}

func (s *Scheduler) countRejected(p Priority) {
	if p == PriorityNormal {
		s.dropped++
	} else {
		s.refused++
	}
	s.m.dropped.WithLabelValues(p.String()).Inc()
}

// Pending reports whether any task for id is queued or being checked.
func (s *Scheduler) Pending(id proxy.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perProxy[id] > 0
}

// PendingKey reports whether the task with key k is queued or running.
func (s *Scheduler) PendingKey(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending[k]
}

// Stats returns the current counts.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		QueuedHigh: len(s.high), QueuedNormal: len(s.normal), InFlight: s.running,
		Dropped: s.dropped, Refused: s.refused, QueueSize: s.queueSize, MaxInFlight: s.limit,
	}
}

// Run dispatches queued tasks until ctx is done, then waits for running
// checks (which see ctx cancelled) and returns.
func (s *Scheduler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		t, ok := s.next()
		if !ok {
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if !s.pace(ctx) {
			s.mu.Lock()
			s.unpendLocked(t.Key())
			s.running--
			s.mu.Unlock()
			return nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.m.inFlight.Inc()
			obs := s.exec.Check(ctx, t)
			s.m.inFlight.Dec()
			s.m.observe(obs)
			if ctx.Err() == nil {
				// A check cut short by shutdown says nothing about the proxy.
				s.report(obs)
			}
			s.mu.Lock()
			s.unpendLocked(t.Key())
			s.running--
			s.mu.Unlock()
			s.poke()
		}()
	}
}

// next pops the highest-priority task if the in-flight bound allows one
// more check.
func (s *Scheduler) next() (Task, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running >= s.limit {
		return Task{}, false
	}
	var t Task
	switch {
	case len(s.high) > 0:
		t = s.high[0]
		s.high[0] = Task{}
		s.high = s.high[1:]
	case len(s.normal) > 0:
		t = s.normal[0]
		s.normal[0] = Task{}
		s.normal = s.normal[1:]
	default:
		return Task{}, false
	}
	s.running++
	s.gauges()
	return t, true
}

func (s *Scheduler) gauges() {
	s.m.depth.WithLabelValues("high").Set(float64(len(s.high)))
	s.m.depth.WithLabelValues("normal").Set(float64(len(s.normal)))
}

type schedMetrics struct {
	checks   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	depth    *prometheus.GaugeVec
	inFlight prometheus.Gauge
	dropped  *prometheus.CounterVec
}

func newSchedMetrics(reg *prometheus.Registry) *schedMetrics {
	m := &schedMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "checker", Name: "checks_total",
			Help: "Health checks executed, by level and result.",
		}, []string{"level", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "proxypool", Subsystem: "checker", Name: "check_duration_seconds",
			Help:    "Health check latency.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10),
		}, []string{"level"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "checker", Name: "queue_depth",
			Help: "Queued check tasks, by priority.",
		}, []string{"priority"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "checker", Name: "in_flight",
			Help: "Checks running now.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "checker", Name: "dropped_total",
			Help: "Check tasks shed (normal) or refused (high) because the queue was full.",
		}, []string{"priority"}),
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.duration, m.depth, m.inFlight, m.dropped)
	}
	return m
}

func (m *schedMetrics) observe(o Observation) {
	result := "success"
	if !o.Success {
		result = "failure_" + o.Phase.String()
	}
	m.checks.WithLabelValues(o.Level.String(), result).Inc()
	m.duration.WithLabelValues(o.Level.String()).Observe(o.Latency.Seconds())
}

var _ Executor = (*Checker)(nil)
