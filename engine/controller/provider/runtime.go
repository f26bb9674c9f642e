package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Store is the part of the activity pool a runtime needs.
type Store interface {
	Inventory(ctx context.Context, upstream string, now time.Time) (upstream.Inventory, error)
	Admit(ctx context.Context, upstream string, ps []proxy.Proxy, maxSize int) (activitypool.AdmitResult, error)
}

// Bounds of a runtime.
const (
	// DefaultTick is how often inventory is re-read without a signal.
	DefaultTick = time.Second
	// maxRetryAfter caps a vendor's Retry-After so a hostile or broken
	// answer cannot park an upstream for days.
	maxRetryAfter = time.Hour
	// maxRedirects bounds redirects a vendor API may answer with.
	maxRedirects = 3
	// maxHookTime bounds the Depleted and Admitted hooks.
	maxHookTime = 10 * time.Second
)

// StoppedMaxTotal is the Status.Stopped text once the ledger is spent.
const StoppedMaxTotal = "maxTotal reached"

// RuntimeOptions configures a Runtime.
type RuntimeOptions struct {
	Upstream config.Upstream
	// AllowLoopback is security.allowLoopbackDestinations: the vendor URL
	// and candidates may be loopback (tests, demo). Private ranges never.
	AllowLoopback bool
	Adapter       upstream.Adapter
	Store         Store
	Ledger        *Ledger // nil: a fresh one from fetch.maxTotal
	Metrics       *Metrics
	// Depleted is called once when consecutive empties reach the threshold.
	Depleted func(ctx context.Context, upstream string)
	// Admitted receives the IDs of newly admitted proxies (to be checked).
	Admitted func(ctx context.Context, upstream string, ids []proxy.ID)
	// HTTPClient overrides the guarded client (tests of the guard itself
	// never set it).
	HTTPClient *http.Client
	Now        func() time.Time
	Logger     *slog.Logger
	Tick       time.Duration
	// Jitter returns a number in [0,1); default math/rand/v2.
	Jitter func() float64
}

// Status is a runtime's view for the admin API.
type Status struct {
	Calls, Success, Empty, DuplicateOnly, Errors int64
	ConsecutiveEmpty, ConsecutiveErrors          int
	TotalFetched                                 int64 // proxies admitted as new
	LedgerUsed                                   int64
	InFlight                                     int
	LastOutcome, LastError                       string
	LastFetchAt, BackoffUntil                    time.Time
	Stopped                                      string
}

// Runtime fetches for one upstream. Create with NewRuntime, start with Run.
type Runtime struct {
	o       RuntimeOptions
	name    string
	client  *http.Client
	limiter *rate.Limiter
	sem     chan struct{}
	signal  chan struct{}
	sf      singleflight.Group
	wg      sync.WaitGroup

	mu           sync.Mutex
	refilling    bool
	pending      int // proxies expected from calls in flight
	counters     upstream.Counters
	backoffUntil time.Time
	st           Status
}

// NewRuntime builds a runtime; nothing runs until Run.
func NewRuntime(o RuntimeOptions) *Runtime {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Tick <= 0 {
		o.Tick = DefaultTick
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Ledger == nil {
		o.Ledger = NewLedger(o.Upstream.Fetch.MaxTotal)
	}
	if o.Depleted == nil {
		o.Depleted = func(context.Context, string) {}
	}
	if o.Admitted == nil {
		o.Admitted = func(context.Context, string, []proxy.ID) {}
	}
	f := o.Upstream.Fetch
	r := &Runtime{
		o:       o,
		name:    o.Upstream.Name,
		client:  o.HTTPClient,
		limiter: rate.NewLimiter(rate.Every(f.RequestInterval), 1),
		sem:     make(chan struct{}, max(f.MaxInFlight, 1)),
		signal:  make(chan struct{}, 1),
	}
	if r.client == nil {
		r.client = guardedClient(o.AllowLoopback, f.Timeout)
	}
	return r
}

// guardedClient performs vendor calls: bounded in time, never through an
// environment proxy, refusing denied destinations at dial time (after DNS,
// on every redirect).
func guardedClient(allowLoopback bool, timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: timeout, Control: dialControl(allowLoopback)}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		MaxIdleConns:          4,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(_ *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("stopped after %d redirects", maxRedirects)
			}
			return nil
		},
	}
}

// Name is the upstream's name.
func (r *Runtime) Name() string { return r.name }

// Signal asks for a refill check soon. Signals coalesce: a burst of them
// costs one inventory read.
func (r *Runtime) Signal() {
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// Status returns a copy of the runtime's state.
func (r *Runtime) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.st
	s.ConsecutiveEmpty = r.counters.ConsecutiveEmpty
	s.ConsecutiveErrors = r.counters.ConsecutiveErrors
	s.BackoffUntil = r.backoffUntil
	s.LedgerUsed = r.o.Ledger.Used()
	s.InFlight = len(r.sem)
	if r.o.Ledger.Exhausted() {
		s.Stopped = StoppedMaxTotal
	}
	return s
}

// Run drives the runtime until ctx is done, then waits for calls in flight
// (which see ctx cancelled) and returns.
func (r *Runtime) Run(ctx context.Context) error {
	defer r.wg.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-r.signal:
		}
		wait := r.Refill(ctx)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// Refill runs one planning cycle and returns how long until the next one is
// useful. Concurrent callers share one cycle.
func (r *Runtime) Refill(ctx context.Context) time.Duration {
	v, _, _ := r.sf.Do("refill", func() (any, error) { return r.cycle(ctx), nil })
	return v.(time.Duration)
}

func (r *Runtime) cycle(ctx context.Context) time.Duration {
	if ctx.Err() != nil {
		return r.o.Tick
	}
	now := r.o.Now()
	if r.o.Ledger.Exhausted() {
		r.mu.Lock()
		r.st.Stopped = StoppedMaxTotal
		r.mu.Unlock()
		return r.o.Tick
	}
	r.mu.Lock()
	until := r.backoffUntil
	r.mu.Unlock()
	if d := until.Sub(now); d > 0 {
		return min(d, r.o.Tick)
	}
	inv, err := r.o.Store.Inventory(ctx, r.name, now)
	if err != nil {
		r.o.Logger.Warn("reading inventory", "upstream", r.name, "err", err)
		return r.o.Tick
	}
	pl := r.o.Upstream.Pool
	r.mu.Lock()
	// Calls in flight will add proxies the store does not know yet; counting
	// them as pending keeps a slow call from being stacked with more.
	inv.Pending += r.pending
	inv.Managed += r.pending
	want, refilling := upstream.Plan(inv, upstream.PoolLimits{Minimum: pl.Minimum, Target: pl.Target, MaxSize: pl.MaxSize}, r.refilling)
	r.refilling = refilling
	r.mu.Unlock()
	if want <= 0 {
		return r.o.Tick
	}
	count := min(want, r.o.Upstream.Fetch.EstimatedIPsPerCall)
	select {
	case r.sem <- struct{}{}:
	default:
		return r.o.Tick // a finishing call signals
	}
	res := r.limiter.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		<-r.sem
		return d
	}
	grant := r.o.Ledger.Reserve(count)
	if grant == 0 {
		res.CancelAt(now)
		<-r.sem
		return r.o.Tick
	}
	r.mu.Lock()
	r.pending += grant
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.fetch(ctx, grant)
		r.mu.Lock()
		r.pending -= grant
		r.mu.Unlock()
		<-r.sem
		r.Signal()
	}()
	return r.o.Tick
}

// callResult is the host's reading of one vendor call.
type callResult struct {
	candidates []proxy.Candidate
	retryAfter time.Duration
	err        error
	// certain: the call's cost is known (no answer was sent, or the answer
	// was read and parsed). Uncertain calls are charged as expected.
	certain bool
}

func (r *Runtime) fetch(ctx context.Context, count int) {
	start := time.Now()
	now := r.o.Now()
	res := r.call(ctx, count, now)
	if ctx.Err() != nil && res.err != nil {
		// Cancelled by stop or replacement: says nothing about the vendor
		// and must not count as Error, let alone Empty.
		r.o.Ledger.Settle(count, 0, false, r.o.Upstream.Fetch.EstimatedIPsPerCall)
		return
	}
	r.o.Metrics.duration.WithLabelValues(r.name).Observe(time.Since(start).Seconds())

	var (
		valid  []proxy.Proxy
		admit  activitypool.AdmitResult
		failed = res.err != nil
	)
	if !failed {
		var rejected int
		valid, rejected = r.convert(res.candidates, now)
		r.o.Metrics.fetched.WithLabelValues(r.name).Add(float64(len(valid)))
		r.o.Metrics.rejected.WithLabelValues(r.name).Add(float64(rejected))
	}
	est := r.o.Upstream.Fetch.EstimatedIPsPerCall
	if failed {
		r.o.Ledger.Settle(count, 0, res.certain, est)
	} else {
		r.o.Ledger.Settle(count, len(valid), true, est)
	}
	if !failed && len(valid) > 0 {
		var err error
		admit, err = r.o.Store.Admit(ctx, r.name, valid, r.o.Upstream.Pool.MaxSize)
		if err != nil {
			// The vendor delivered; the store lost them. Back off like an
			// error so a broken store is not hammered with fresh batches.
			failed, res.err = true, fmt.Errorf("admitting proxies: %w", err)
		}
		r.o.Metrics.duplicates.WithLabelValues(r.name).Add(float64(admit.Duplicates))
	}
	outcome := upstream.Classify(failed, len(valid), len(admit.Added))
	r.o.Metrics.fetches.WithLabelValues(r.name, outcome.String()).Inc()

	r.mu.Lock()
	var depleted bool
	r.counters, depleted = r.counters.Apply(outcome, r.o.Upstream.Fetch.EmptyThreshold)
	r.st.Calls++
	r.st.LastOutcome = outcome.String()
	r.st.LastFetchAt = now
	r.st.TotalFetched += int64(len(admit.Added))
	var wait time.Duration
	switch outcome {
	case upstream.Success:
		r.st.Success++
	case upstream.Empty:
		r.st.Empty++
	case upstream.DuplicateOnly:
		r.st.DuplicateOnly++
	case upstream.Error:
		r.st.Errors++
		r.st.LastError = res.err.Error()
		wait = r.backoff(r.counters.ConsecutiveErrors)
	}
	if outcome != upstream.Error {
		r.st.LastError = ""
	}
	wait = max(wait, min(res.retryAfter, maxRetryAfter))
	r.backoffUntil = now.Add(wait)
	r.mu.Unlock()
	r.o.Metrics.backoff.WithLabelValues(r.name).Set(wait.Seconds())
	if outcome == upstream.Error {
		r.o.Logger.Warn("provider call failed", "upstream", r.name, "err", res.err, "backoff", wait)
	}

	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxHookTime)
	defer cancel()
	if len(admit.Added) > 0 {
		r.o.Admitted(hctx, r.name, admit.Added)
	}
	if depleted {
		r.o.Logger.Info("upstream depleted", "upstream", r.name, "consecutiveEmpty", r.o.Upstream.Fetch.EmptyThreshold)
		r.o.Depleted(hctx, r.name)
	}
}

// backoff is exponential with full jitter: uniform in [initial, cap] where
// cap doubles per consecutive error up to backoff.max.
func (r *Runtime) backoff(errs int) time.Duration {
	b := r.o.Upstream.Fetch.Backoff
	ceil := b.Initial
	for i := 1; i < errs && ceil < b.Max; i++ {
		ceil *= 2
	}
	ceil = min(ceil, b.Max)
	return b.Initial + time.Duration(r.o.Jitter()*float64(ceil-b.Initial))
}

// call performs one vendor call: build, HTTP, bounded read, parse.
func (r *Runtime) call(ctx context.Context, count int, now time.Time) callResult {
	p := r.o.Upstream.Provider
	in := upstream.BuildInput{Params: map[string]string(p.Params), Secrets: make(map[string]string, len(p.Secrets)), Count: count, Now: now}
	if in.Params == nil {
		in.Params = map[string]string{}
	}
	for k, s := range p.Secrets {
		in.Secrets[k] = s.Value()
	}
	req, err := r.o.Adapter.BuildRequest(ctx, in)
	if err != nil {
		return callResult{err: fmt.Errorf("building request: %w", err), certain: true}
	}
	hreq, err := newHTTPRequest(ctx, req)
	if err != nil {
		return callResult{err: err, certain: true}
	}
	f := r.o.Upstream.Fetch
	cctx, cancel := context.WithTimeout(ctx, f.Timeout)
	defer cancel()
	resp, err := r.client.Do(hreq.WithContext(cctx))
	if err != nil {
		return callResult{err: fmt.Errorf("calling provider: %w", redactURLError(err)), certain: notSent(err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.MaxResponseBytes+1))
	if err != nil {
		return callResult{err: fmt.Errorf("reading provider response: %w", redactURLError(err))}
	}
	if int64(len(body)) > f.MaxResponseBytes {
		return callResult{err: fmt.Errorf("reading provider response: response larger than %d bytes", f.MaxResponseBytes)}
	}
	retryAfter := parseRetryAfter(resp.Header.Get("Retry-After"), now)
	if resp.StatusCode == http.StatusTooManyRequests {
		r.o.Metrics.http429.WithLabelValues(r.name).Inc()
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return callResult{err: fmt.Errorf("provider answered HTTP %d", resp.StatusCode), retryAfter: retryAfter, certain: true}
	}
	headers := make(map[string]string, len(resp.Header))
	for k, v := range resp.Header {
		if len(v) > 0 {
			headers[http.CanonicalHeaderKey(k)] = v[0]
		}
	}
	pr, err := r.o.Adapter.ParseResponse(ctx, upstream.Response{Status: resp.StatusCode, Headers: headers, Body: body}, now)
	if err != nil {
		return callResult{err: fmt.Errorf("parsing provider response: %w", err), retryAfter: retryAfter}
	}
	return callResult{candidates: pr.Proxies, retryAfter: max(retryAfter, pr.RetryAfter), certain: true}
}

func newHTTPRequest(ctx context.Context, req upstream.Request) (*http.Request, error) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		return nil, errors.New("building request: adapter returned an unparsable URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("building request: URL scheme %q is not http or https", u.Scheme)
	}
	var body io.Reader
	if len(req.Body) > 0 {
		body = bytes.NewReader(req.Body)
	}
	h, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("building request: %w", redactURLError(err))
	}
	for k, v := range req.Headers {
		h.Header.Set(k, v)
	}
	return h, nil
}

// redactURLError drops the URL from a *url.Error: vendor URLs often carry
// the API key as a query parameter.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// notSent reports a failure that happened before the request could reach
// the vendor (dial refused, denied destination, DNS), so nothing was used.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, errDeniedDestination)
}

// parseRetryAfter reads delta-seconds or an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0
		}
		return min(time.Duration(n)*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter)
	}
	return 0
}

// convert validates candidates and turns them into FETCHED proxies; it
// returns how many were rejected.
func (r *Runtime) convert(cs []proxy.Candidate, now time.Time) ([]proxy.Proxy, int) {
	pl := r.o.Upstream.Pool
	out := make([]proxy.Proxy, 0, len(cs))
	seen := make(map[proxy.ID]bool, len(cs))
	rejected := 0
	for i := range cs {
		c := &cs[i]
		if err := c.Validate(); err != nil {
			rejected++
			continue
		}
		if err := checkCandidateHost(c.Host, r.o.AllowLoopback); err != nil {
			rejected++
			continue
		}
		exp := c.Expiry(now, pl.DefaultTTL)
		usable := exp.Add(-pl.AllocationSafetyMargin)
		if !now.Before(usable) {
			rejected++ // dead on arrival: no allocatable time left
			continue
		}
		key := c.Key()
		id := proxy.MakeID(key)
		if seen[id] {
			continue // the same proxy twice in one answer is one candidate
		}
		seen[id] = true
		tags := make(map[string]string, len(r.o.Upstream.Tags)+len(c.Tags))
		for k, v := range r.o.Upstream.Tags {
			tags[k] = v
		}
		for k, v := range c.Tags {
			tags[k] = v
		}
		out = append(out, proxy.Proxy{
			ID: id, Key: key, Password: c.Password, Upstream: r.name,
			CreatedAt: now, ExpiresAt: exp, UsableUntil: usable,
			MaxConcurrency: pl.MaxConcurrency, State: proxy.StateFetched,
			Region: c.Region, Carrier: c.Carrier, Tags: tags,
		})
	}
	return out, rejected
}
