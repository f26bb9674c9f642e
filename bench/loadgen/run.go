package loadgen

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// allClasses is every class a run counts, in report order.
var allClasses = []Class{
	ClassOK, ClassTimeout, ClassRefused, ClassReset, ClassHTTP4xx, ClassHTTP5xx,
	ClassProxy407, ClassProxy503, ClassProxyErr, ClassOther, ClassUnsent, ClassCut,
}

// tally counts outcomes without locks; the map is built once and only
// read afterwards.
type tally struct {
	classes  map[Class]*atomic.Int64
	ops      atomic.Int64
	bytes    atomic.Int64
	returned atomic.Int64
}

func newTally() *tally {
	t := &tally{classes: make(map[Class]*atomic.Int64, len(allClasses))}
	for _, c := range allClasses {
		t.classes[c] = new(atomic.Int64)
	}
	return t
}

func (t *tally) add(c Class, bytes int64) {
	t.ops.Add(1)
	t.classes[c].Add(1)
	t.bytes.Add(bytes)
}

func (t *tally) errors() int64 { return t.ops.Load() - t.classes[ClassOK].Load() }

func (t *tally) snapshot() map[Class]int64 {
	out := make(map[Class]int64, len(t.classes))
	for c, v := range t.classes {
		if n := v.Load(); n > 0 {
			out[c] = n
		}
	}
	return out
}

// outcome is what one operation reports.
type outcome struct {
	class    Class
	bytes    int64
	setup    time.Duration // CONNECT setup, when there was one
	returned int64         // extract: proxies handed out
	closed   bool          // tunnels: the tunnel cannot be used again
}

// operation runs one request (or tunnel) for worker w.
type operation func(ctx context.Context, w int) outcome

// Run performs the load cfg describes and returns what it measured. It
// returns by itself at the first bound reached, and at cfg.MaxDuration
// whatever happens; canceling ctx stops it early. An error means the run
// could not be set up at all; failed operations are counted in the result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Two stops: canceling ctx (SIGINT) is soft, no new operation starts
	// but those in flight finish within their Timeout; MaxDuration is
	// hard, it cuts whatever is still running.
	hard, cancelHard := context.WithTimeout(context.WithoutCancel(ctx), cfg.MaxDuration)
	defer cancelHard()
	soft, cancelSoft := context.WithCancel(hard)
	defer cancelSoft()
	stopSoft := context.AfterFunc(ctx, cancelSoft)
	defer stopSoft()
	st := stops{soft: soft, hard: hard, user: ctx}

	sampler := NewSampler(cfg.SUTPIDs, cfg.SUTTree, cfg.SampleInterval)
	sctx, stopSampler := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		sampler.Run(sctx)
	}()

	start := time.Now()
	t := newTally()
	res := &Result{
		Scenario: cfg.Scenario, Mode: cfg.Mode, URL: cfg.URL, Proxy: redactProxy(cfg.Proxy),
		Method: cfg.Method, Concurrency: cfg.Concurrency, TargetRate: cfg.Rate, Start: start,
	}
	stopProgress := startProgress(cfg, t, start)
	var err error
	if cfg.Mode == ModeTunnels {
		err = runTunnels(st, &cfg, t, res)
	} else {
		err = runOps(st, &cfg, t, res, start)
	}
	stopProgress()
	stopSampler()
	<-sampled
	if err != nil {
		return nil, err
	}

	end := time.Now()
	res.Elapsed = end.Sub(start).Seconds()
	if res.Stopped == "" {
		res.Stopped = st.reason()
	}
	res.Operations = t.ops.Load()
	res.Classes = t.snapshot()
	res.OK = res.Classes[ClassOK]
	res.Bytes = t.bytes.Load()
	res.ProxiesReturned = t.returned.Load()
	if cfg.Mode != ModeTunnels && res.Elapsed > 0 {
		res.Throughput = float64(res.OK) / res.Elapsed
		res.BytesPerS = float64(res.Bytes) / res.Elapsed
	}
	res.Loadgen = goStats()
	res.SUT, res.Host = sampler.Stats()
	return res, nil
}

// stops are the two ways a run ends early: soft (the caller canceled: no
// new operation starts) and hard (MaxDuration: everything is cut).
type stops struct {
	soft, hard, user context.Context
}

// reason names the bound that ended a run that did not finish its own
// count or duration.
func (s stops) reason() string {
	switch {
	case s.hard.Err() != nil:
		return "max-duration"
	case s.user.Err() != nil:
		return "canceled"
	}
	return "completed"
}

// runOps drives http, connect and extract operations: Concurrency workers
// take operation numbers from one counter until a bound is reached.
func runOps(st stops, cfg *Config, t *tally, res *Result, start time.Time) error {
	ctx, hard := st.soft, st.hard
	op, cleanup, err := newOperation(cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	sched := Schedule{Start: start, Rate: cfg.Rate}
	limit := int64(math.MaxInt64)
	if cfg.Requests > 0 {
		limit = cfg.Requests
	}
	// With a duration, no operation starts after the deadline: in an open
	// loop, operations still waiting for a worker then are unsent (the
	// schedule was not kept), and the run ends within one Timeout of it.
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
		if sched.Open() {
			limit = min(limit, sched.Within(cfg.Duration))
		}
	}
	res.Corrected = sched.Open()
	lat := NewRecorder(cfg.MaxDuration + cfg.Timeout)
	tl := newTimeline(start, cfg.MaxDuration)
	defer func() { res.Timeline = tl.seconds(time.Now()) }()
	var setup *Recorder
	if cfg.Mode == ModeConnect {
		setup = NewRecorder(cfg.Timeout)
	}

	var next, sent atomic.Int64
	var stoppedAt atomic.Int64 // UnixNano when ctx ended
	stopWatch := context.AfterFunc(ctx, func() { stoppedAt.Store(time.Now().UnixNano()) })
	defer stopWatch()
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= limit || (!deadline.IsZero() && !time.Now().Before(deadline)) {
					return
				}
				due := sched.Due(i)
				if wait := time.Until(due); sched.Open() && wait > 0 {
					timer.Reset(wait)
					select {
					case <-ctx.Done():
						timer.Stop()
						return
					case <-timer.C:
					}
				}
				sentAt := time.Now()
				sent.Add(1)
				o := op(hard, w)
				if o.class != ClassOK && hard.Err() != nil {
					// Cut by the hard bound, not failed by the system under test.
					o.class = ClassCut
				}
				t.add(o.class, o.bytes)
				t.returned.Add(o.returned)
				now := time.Now()
				l := sched.Latency(due, sentAt, now)
				tl.add(now, o.class == ClassOK, l)
				if o.class == ClassOK {
					lat.Record(w, l)
					if setup != nil && o.setup > 0 {
						setup.Record(w, o.setup)
					}
				}
			}
		}()
	}
	wg.Wait()
	if sched.Open() {
		// Open-loop operations that came due before the stop but never
		// found a worker: the system under test was too slow for the
		// schedule. Those not yet due were simply never part of the run.
		stop := time.Now()
		if at := stoppedAt.Load(); at != 0 {
			stop = time.Unix(0, at)
		}
		if !deadline.IsZero() && deadline.Before(stop) {
			stop = deadline
		}
		due := min(limit, sched.Within(stop.Sub(start)))
		if unsent := due - sent.Load(); unsent > 0 {
			t.ops.Add(unsent)
			t.classes[ClassUnsent].Add(unsent)
		}
	}
	if ctx.Err() == nil {
		res.Stopped = "duration"
		if cfg.Requests > 0 && sent.Load() >= cfg.Requests {
			res.Stopped = "requests"
		}
	}
	res.Latency = lat.Quantiles()
	if setup != nil {
		q := setup.Quantiles()
		res.Setup = &q
	}
	return nil
}

// startProgress prints a line every ProgressInterval; the returned func
// stops it.
func startProgress(cfg Config, t *tally, start time.Time) func() {
	if cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(cfg.ProgressInterval)
		defer tick.Stop()
		var lastOps int64
		last := start
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				ops := t.ops.Load()
				rate := float64(ops-lastOps) / now.Sub(last).Seconds()
				fmt.Fprintf(cfg.Progress, "[%6.1fs] %s: %d done, %.0f/s now, %d errors\n",
					now.Sub(start).Seconds(), cfg.Scenario, ops, rate, t.errors())
				lastOps, last = ops, now
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// redactProxy keeps proxy passwords out of results and logs.
func redactProxy(p string) string {
	if p == "" {
		return ""
	}
	u, err := url.Parse(p)
	if err != nil {
		return "(unparsable proxy URL)"
	}
	return u.Redacted()
}
