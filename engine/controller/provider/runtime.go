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

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Store is the part of the activity pool a runtime needs.
type Store interface {
	InventorySource
	Admit(ctx context.Context, upstream string, ps []proxy.Proxy, maxSize int) (activitypool.AdmitResult, error)
}

// InventorySource returns an upstream's inventory; the controller passes
// pool.InventoryReader, which subtracts the workers' active and reserved
// capacity from the store's counts.
type InventorySource interface {
	Inventory(ctx context.Context, upstream string, now time.Time) (upstream.Inventory, error)
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
	// Inventory overrides Store's inventory (nil: Store).
	Inventory InventorySource
	// Gate decides each vendor call (nil: the local gate over Ledger).
	Gate   Gate
	Ledger *Ledger // the local gate's; nil: a fresh one from fetch.maxTotal
	// Tally keeps the cumulative counters across runtime replacement (nil:
	// a fresh one).
	Tally   *Tally
	Metrics *Metrics
	// Depleted is called when consecutive empties reach the threshold. An
	// error (the management store is down) is retried on every cycle until
	// it succeeds or the run of empties ends.
	Depleted func(ctx context.Context, upstream string) error
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
	// Leader: this runtime holds the upstream's fetch leadership (always
	// on embedded storage). LeaderError is a fixed reason it does not,
	// empty when another controller simply leads.
	Leader      bool
	LeaderError string
	// LastError is a fixed description of the last Error's class, never
	// an adapter's or vendor's text (which may quote bodies or addresses).
	LastOutcome, LastError    string
	LastFetchAt, BackoffUntil time.Time
	Stopped                   string
	// DepletionPending: the empty threshold was reached and the routing
	// switch has not been recorded yet (retried every cycle).
	DepletionPending bool
}

// Tally is an upstream's cumulative fetch record. It outlives runtime
// replacement (reload, disable/enable) so the admin view never resets.
type Tally struct {
	mu sync.Mutex
	st Status
}

func (t *Tally) snapshot() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.st
}

// Runtime fetches for one upstream. Create with NewRuntime, start with Run.
type Runtime struct {
	o      RuntimeOptions
	name   string
	client *http.Client
	gate   Gate
	signal chan struct{}
	sf     singleflight.Group
	wg     sync.WaitGroup

	// admitMu makes a call's admission and the end of its pending count
	// one step for the planner, which holds it shared while it reads the
	// inventory and the pending count: otherwise it could count admitted
	// proxies twice (in the store and still pending), see the target
	// reached, end the refill early and stop above minimum but short of
	// target.
	admitMu sync.RWMutex

	mu           sync.Mutex
	refilling    bool
	pending      int // proxies expected from calls in flight
	counters     upstream.Counters
	backoffUntil time.Time
	// depletePending: the threshold was reached but the Depleted hook
	// failed; retried each cycle while the run of empties lasts.
	depletePending bool
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
		o.Depleted = func(context.Context, string) error { return nil }
	}
	if o.Inventory == nil {
		o.Inventory = o.Store
	}
	if o.Tally == nil {
		o.Tally = &Tally{}
	}
	if o.Admitted == nil {
		o.Admitted = func(context.Context, string, []proxy.ID) {}
	}
	if o.Gate == nil {
		o.Gate = newLocalGate(o.Upstream.Fetch, o.Ledger)
	}
	r := &Runtime{
		o:      o,
		name:   o.Upstream.Name,
		client: o.HTTPClient,
		gate:   o.Gate,
		signal: make(chan struct{}, 1),
	}
	if r.client == nil {
		r.client = guardedClient(o.AllowLoopback, o.Upstream.Fetch.Timeout)
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

// statusTimeout bounds the gate's reads (the cluster ledger) for Status.
const statusTimeout = 2 * time.Second

// Status returns a copy of the runtime's state: the upstream's tally plus
// this runtime's consecutive counters, backoff, leadership, ledger and
// calls in flight.
func (r *Runtime) Status() Status {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	v := r.gate.View(ctx)
	s := r.o.Tally.snapshot()
	r.mu.Lock()
	defer r.mu.Unlock()
	s.ConsecutiveEmpty = r.counters.ConsecutiveEmpty
	s.ConsecutiveErrors = r.counters.ConsecutiveErrors
	s.BackoffUntil = r.backoffUntil
	s.DepletionPending = r.depletePending
	s.applyGate(v)
	return s
}

func (s *Status) applyGate(v GateView) {
	s.Leader, s.LeaderError = v.Leader, v.LeaderError
	s.LedgerUsed, s.InFlight = v.LedgerUsed, v.InFlight
	if v.Exhausted {
		s.Stopped = StoppedMaxTotal
	}
}

// Run drives the runtime until ctx is done, then waits for calls in flight
// (which see ctx cancelled), gives up leadership and returns.
func (r *Runtime) Run(ctx context.Context) error {
	defer r.gate.Release(ctx)
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
	r.retryDepletion(ctx)
	if !r.gate.Lead(ctx) {
		return r.o.Tick // another controller fetches, or nobody can tell: fail closed
	}
	if r.gate.View(ctx).Exhausted {
		return r.o.Tick // Status reports StoppedMaxTotal
	}
	r.mu.Lock()
	until := r.backoffUntil
	r.mu.Unlock()
	if d := until.Sub(now); d > 0 {
		return min(d, r.o.Tick)
	}
	r.admitMu.RLock()
	inv, err := r.o.Inventory.Inventory(ctx, r.name, now)
	if err != nil {
		r.admitMu.RUnlock()
		r.o.Logger.Warn("reading inventory", "upstream", r.name, "err", err)
		return r.o.Tick
	}
	pl := r.o.Upstream.Pool
	r.mu.Lock()
	// Calls in flight will add proxies the store does not know yet; counting
	// them as pending keeps a slow call from being stacked with more.
	inv.Pending += r.pending
	inv.Managed += r.pending
	r.admitMu.RUnlock()
	want, refilling := upstream.Plan(inv, upstream.PoolLimits{Minimum: pl.Minimum, Target: pl.Target, MaxSize: pl.MaxSize}, r.refilling)
	r.refilling = refilling
	r.mu.Unlock()
	if want <= 0 {
		return r.o.Tick
	}
	g := r.gate.Acquire(ctx, min(want, r.o.Upstream.Fetch.EstimatedIPsPerCall), now)
	if g.Count == 0 {
		if g.Retry > 0 {
			return g.Retry
		}
		return r.o.Tick // a finishing call signals
	}
	r.mu.Lock()
	r.pending += g.Count
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.fetch(ctx, g)
		g.done()
		r.Signal()
	}()
	if g.Count < want && g.More {
		// More is wanted and another permit is free: plan again as soon as
		// requestInterval allows rather than a whole tick later.
		return min(max(r.o.Upstream.Fetch.RequestInterval, time.Millisecond), r.o.Tick)
	}
	return r.o.Tick
}

// retryDepletion calls the Depleted hook again if its last call failed
// while the run of empties still stands.
func (r *Runtime) retryDepletion(ctx context.Context) {
	r.mu.Lock()
	pending := r.depletePending
	r.mu.Unlock()
	if !pending {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, maxHookTime)
	defer cancel()
	r.deplete(hctx)
}

// deplete calls the Depleted hook and records whether it must be retried.
func (r *Runtime) deplete(ctx context.Context) {
	err := r.o.Depleted(ctx, r.name)
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.depletePending
	// A Success or DuplicateOnly meanwhile ended the run: nothing to retry.
	r.depletePending = err != nil && r.counters.ConsecutiveEmpty >= r.o.Upstream.Fetch.EmptyThreshold
	switch {
	case r.depletePending && !was:
		r.o.Logger.Warn("recording upstream depletion failed; retrying every cycle", "upstream", r.name, "err", err)
	case was && err == nil:
		r.o.Logger.Info("upstream depletion recorded after retries", "upstream", r.name)
	}
}

// Error classes: the fixed text recorded as Status.LastError. Adapter and
// vendor texts never leave the call: they may quote a body, and bodies hold
// proxy addresses and passwords.
const (
	kindBuild     = "building the request failed"
	kindTransport = "calling provider failed"
	kindTimeout   = "calling provider timed out"
	kindDenied    = "provider address not allowed"
	kindRead      = "reading provider response failed"
	kindSize      = "response larger than maxResponseBytes"
	kindParse     = "parsing provider response failed"
	kindAdmit     = "admitting proxies failed"
)

// callResult is the host's reading of one vendor call.
type callResult struct {
	candidates []proxy.Candidate
	retryAfter time.Duration
	err        error
	// kind is the fixed description of err for the status (see kind*).
	kind string
	// logErr is what may be logged: err for host-side failures, the bare
	// kind for adapter failures.
	logErr error
	// certain: the call's cost is known (no answer was sent, or the answer
	// was read and parsed). Uncertain calls are charged as expected.
	certain bool
}

// endPending ends the call's pending count; with admit it first admits
// the call's proxies, as one step for the planner (admitMu).
func (r *Runtime) endPending(n int, admit func()) {
	r.admitMu.Lock()
	defer r.admitMu.Unlock()
	if admit != nil {
		admit()
	}
	r.mu.Lock()
	r.pending -= n
	r.mu.Unlock()
}

func (r *Runtime) fetch(ctx context.Context, g Grant) {
	admitted := false
	defer func() {
		if !admitted {
			r.endPending(g.Count, nil)
		}
	}()
	start := time.Now()
	now := r.o.Now()
	res := r.call(ctx, g.Count, now)
	if ctx.Err() != nil && res.err != nil {
		// Cancelled by stop or replacement: says nothing about the vendor
		// and must not count as Error, let alone Empty.
		r.gate.Settle(ctx, g, 0, false)
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
	res.candidates = nil // the vendor's answer is not kept beyond its use
	if failed {
		r.gate.Settle(ctx, g, 0, res.certain)
	} else {
		r.gate.Settle(ctx, g, len(valid), true)
	}
	if !failed && len(valid) > 0 {
		var err error
		admitted = true
		r.endPending(g.Count, func() {
			admit, err = r.o.Store.Admit(ctx, r.name, valid, r.o.Upstream.Pool.MaxSize)
		})
		if err != nil {
			// The vendor delivered; the store lost them. Back off like an
			// error so a broken store is not hammered with fresh batches.
			failed = true
			res.err = fmt.Errorf("admitting proxies: %w", err)
			res.kind, res.logErr = kindAdmit, res.err
		}
		r.o.Metrics.duplicates.WithLabelValues(r.name).Add(float64(admit.Duplicates))
	}
	nValid := len(valid)
	valid = nil
	outcome := upstream.Classify(failed, nValid, len(admit.Added))
	r.o.Metrics.fetches.WithLabelValues(r.name, outcome.String()).Inc()

	r.mu.Lock()
	var depleted bool
	r.counters, depleted = r.counters.Apply(outcome, r.o.Upstream.Fetch.EmptyThreshold)
	if r.counters.ConsecutiveEmpty < r.o.Upstream.Fetch.EmptyThreshold {
		r.depletePending = false // the run ended before a retry succeeded
	}
	var wait time.Duration
	if outcome == upstream.Error {
		wait = r.backoff(r.counters.ConsecutiveErrors)
	}
	wait = max(wait, min(res.retryAfter, maxRetryAfter))
	r.backoffUntil = now.Add(wait)
	r.mu.Unlock()
	r.o.Tally.record(outcome, res.kind, now, len(admit.Added))
	r.o.Metrics.backoff.WithLabelValues(r.name).Set(wait.Seconds())
	if outcome == upstream.Error {
		r.o.Logger.Warn("provider call failed", "upstream", r.name, "err", res.logErr, "backoff", wait)
	}

	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxHookTime)
	defer cancel()
	if len(admit.Added) > 0 {
		r.o.Admitted(hctx, r.name, admit.Added)
	}
	if depleted {
		r.o.Logger.Info("upstream depleted", "upstream", r.name, "consecutiveEmpty", r.o.Upstream.Fetch.EmptyThreshold)
		r.deplete(hctx)
	}
}

func (t *Tally) record(o upstream.Outcome, kind string, at time.Time, added int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.st.Calls++
	t.st.LastOutcome = o.String()
	t.st.LastFetchAt = at
	t.st.TotalFetched += int64(added)
	switch o {
	case upstream.Success:
		t.st.Success++
	case upstream.Empty:
		t.st.Empty++
	case upstream.DuplicateOnly:
		t.st.DuplicateOnly++
	case upstream.Error:
		t.st.Errors++
	}
	if o == upstream.Error {
		t.st.LastError = kind
	} else {
		t.st.LastError = ""
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
	req, err := r.o.Adapter.BuildRequest(ctx, buildInput(&r.o.Upstream, count, now))
	if err != nil {
		return failure(kindBuild, fmt.Errorf("building request: %w", err), true)
	}
	hreq, err := newHTTPRequest(ctx, req)
	if err != nil {
		return failure(kindBuild, err, true)
	}
	f := r.o.Upstream.Fetch
	cctx, cancel := context.WithTimeout(ctx, f.Timeout)
	defer cancel()
	resp, err := r.client.Do(hreq.WithContext(cctx))
	if err != nil {
		err = fmt.Errorf("calling provider: %w", redactURLError(err))
		kind := kindTransport
		switch {
		case errors.Is(err, errDeniedDestination):
			kind = kindDenied
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			kind = kindTimeout
		}
		return failure(kind, err, notSent(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.MaxResponseBytes+1))
	if err != nil {
		return failure(kindRead, fmt.Errorf("reading provider response: %w", redactURLError(err)), false)
	}
	if int64(len(body)) > f.MaxResponseBytes {
		return failure(kindSize, fmt.Errorf("reading provider response: response larger than %d bytes", f.MaxResponseBytes), false)
	}
	retryAfter := parseRetryAfter(resp.Header.Get("Retry-After"), now)
	if resp.StatusCode == http.StatusTooManyRequests {
		r.o.Metrics.http429.WithLabelValues(r.name).Inc()
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		res := failure(fmt.Sprintf("provider answered HTTP %d", resp.StatusCode), fmt.Errorf("provider answered HTTP %d", resp.StatusCode), true)
		res.retryAfter = retryAfter
		return res
	}
	headers := make(map[string]string, len(resp.Header))
	for k, v := range resp.Header {
		if len(v) > 0 {
			headers[http.CanonicalHeaderKey(k)] = v[0]
		}
	}
	pr, err := r.o.Adapter.ParseResponse(ctx, upstream.Response{Status: resp.StatusCode, Headers: headers, Body: body}, now)
	if err != nil {
		// The adapter's error may quote the body: only the class leaves.
		res := failure(kindParse, errors.New(kindParse), false)
		res.retryAfter = retryAfter
		return res
	}
	return callResult{candidates: pr.Proxies, retryAfter: max(retryAfter, pr.RetryAfter), certain: true}
}

func failure(kind string, err error, certain bool) callResult {
	return callResult{err: err, kind: kind, logErr: err, certain: certain}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// buildInput is what the adapter gets for one call of up.
func buildInput(up *config.Upstream, count int, now time.Time) upstream.BuildInput {
	p := up.Provider
	in := upstream.BuildInput{Params: map[string]string(p.Params), Secrets: make(map[string]string, len(p.Secrets)), Count: count, Now: now}
	if in.Params == nil {
		in.Params = map[string]string{}
	}
	for k, s := range p.Secrets {
		in.Secrets[k] = s.Value()
	}
	return in
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
