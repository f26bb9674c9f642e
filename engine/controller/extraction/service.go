package extraction

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/coordination"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Store is the part of the activity pool extraction needs.
type Store interface {
	List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error)
	SetOwner(ctx context.Context, ids []proxy.ID, owner string) error
	Extract(ctx context.Context, req extraction.Request) (extraction.Result, error)
}

// Publisher withdraws proxies from the workers; the distribution publisher
// implements it. Publish must return only once every worker applied a
// snapshot that honours the exclusions.
type Publisher interface {
	Exclude(ids []proxy.ID)
	Include(ids []proxy.ID)
	Publish(ctx context.Context) error
}

// RateLimiter is extraction.perClientPerMinute shared by every controller
// of a fleet (cluster storage); redisstore.Coordinator implements it.
type RateLimiter interface {
	AllowN(ctx context.Context, key string, r coordination.Rate, n int) (coordination.RateResult, error)
	// RefundN gives back units AllowN took and the caller did not use.
	RefundN(ctx context.Context, key string, r coordination.Rate, n int) error
}

// Typed errors; the root controller re-exports them.
var (
	ErrInvalidRequest = errors.New("invalid extraction request")
	ErrRateLimited    = errors.New("extraction rate limit exceeded")
)

// RateLimitError says when the client may try again.
type RateLimitError struct{ RetryAfter time.Duration }

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("extraction rate limit exceeded; retry in %s", e.RetryAfter.Round(time.Second))
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// Defaults and bounds.
const (
	DefaultRevokeWait = 2 * time.Second
	revokePoll        = 10 * time.Millisecond
	// DefaultMaxClients bounds the rate limiter's client table.
	DefaultMaxClients = 10000
	// listLimit bounds the scan that looks for revocable proxies.
	listLimit = 100000
	// maxKeys bounds the idempotency keys remembered to spare retries a
	// revocation; one forgotten early only costs the gateway some capacity.
	maxKeys = 10000
)

// Config is the configured part of extraction (config.Extraction).
type Config struct {
	MinRemainingTTL    time.Duration
	MaxHealthCheckAge  time.Duration
	ReserveForGateway  int
	IdempotencyTTL     time.Duration
	MaxCount           int
	PerClientPerMinute int
}

// Options configures a Service.
type Options struct {
	Store     Store
	Publisher Publisher // nil: no gateway, nothing to revoke
	// Workers returns the runtime readers of every worker.
	Workers    func() []worker.RuntimeReader
	Now        func() time.Time
	Logger     *slog.Logger
	Registry   *prometheus.Registry
	RevokeWait time.Duration
	MaxClients int
	// Limiter, when set (cluster storage), enforces perClientPerMinute
	// across the fleet instead of the in-process window; see Extract.
	Limiter RateLimiter
}

// Counters are cumulative since start.
type Counters struct {
	Requests, Returned, Insufficient, Replays, Revoked int64
}

// Service performs extractions.
type Service struct {
	o   Options
	cfg atomic.Pointer[Config]
	m   *metrics
	rl  *limiter
	// keys are the idempotency keys of extractions made, until their
	// record expires in the store.
	keys *expiring

	requests, returned, insufficient, replays, revoked atomic.Int64
	extractMu                                          sync.Mutex
}

// New returns a Service; SetConfig must be called before use.
func New(o Options, cfg Config) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Workers == nil {
		o.Workers = func() []worker.RuntimeReader { return nil }
	}
	if o.RevokeWait <= 0 {
		o.RevokeWait = DefaultRevokeWait
	}
	if o.MaxClients <= 0 {
		o.MaxClients = DefaultMaxClients
	}
	s := &Service{o: o, m: newMetrics(o.Registry), rl: newLimiter(o.MaxClients), keys: newExpiring(maxKeys)}
	s.SetConfig(cfg)
	return s
}

// SetConfig installs new configured defaults (reload).
func (s *Service) SetConfig(c Config) { s.cfg.Store(&c) }

// Counters returns the cumulative counters.
func (s *Service) Counters() Counters {
	return Counters{
		Requests: s.requests.Load(), Returned: s.returned.Load(), Insufficient: s.insufficient.Load(),
		Replays: s.replays.Load(), Revoked: s.revoked.Load(),
	}
}

// Extract performs one extraction. Errors: ErrInvalidRequest,
// *RateLimitError, extraction.ErrInsufficient (allOrNothing short),
// extraction.ErrIdempotencyConflict, or a store failure.
func (s *Service) Extract(ctx context.Context, req extraction.Request) (extraction.Result, error) {
	s.requests.Add(1)
	cfg := s.cfg.Load()
	now := s.o.Now()
	if req.Now.IsZero() {
		req.Now = now
	}
	if req.Fulfillment == "" {
		req.Fulfillment = extraction.Partial
	}
	if req.Filters.MinRemainingTTL == 0 {
		req.Filters.MinRemainingTTL = cfg.MinRemainingTTL
	}
	if req.Filters.MaxHealthCheckAge == 0 {
		req.Filters.MaxHealthCheckAge = cfg.MaxHealthCheckAge
	}
	req.ReserveForGateway = max(req.ReserveForGateway, cfg.ReserveForGateway)
	if req.IdempotencyTTL == 0 {
		req.IdempotencyTTL = cfg.IdempotencyTTL
	}
	if err := req.Validate(); err != nil {
		s.m.requests.WithLabelValues("invalid").Inc()
		return extraction.Result{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if cfg.MaxCount > 0 && req.Count > cfg.MaxCount {
		s.m.requests.WithLabelValues("invalid").Inc()
		return extraction.Result{}, fmt.Errorf("%w: count %d exceeds extraction.maxCount %d", ErrInvalidRequest, req.Count, cfg.MaxCount)
	}
	if err := s.limit(ctx, &req, cfg.PerClientPerMinute, now); err != nil {
		return extraction.Result{}, err
	}
	res, err := s.extract(ctx, &req)
	if cfg.PerClientPerMinute > 0 {
		// The limit is on proxies handed out: refund what was not.
		refund := req.Count
		if err == nil && !res.Replayed {
			refund -= res.Returned
		}
		s.refund(ctx, req.Client, refund, cfg.PerClientPerMinute, now)
	}
	switch {
	case errors.Is(err, extraction.ErrInsufficient):
		s.insufficient.Add(1)
		s.m.insufficient.Inc()
		s.m.requests.WithLabelValues("insufficient").Inc()
		return res, err
	case err != nil:
		s.m.requests.WithLabelValues("error").Inc()
		return res, err
	}
	if !res.Replayed && req.IdempotencyKey != "" && req.IdempotencyTTL > 0 {
		// now was read before the store wrote its record, so this expires
		// no later than that record does.
		s.keys.put(req.IdempotencyKey, now.Add(req.IdempotencyTTL), now)
	}
	if res.Replayed {
		s.replays.Add(1)
		s.m.replays.Inc()
		s.m.requests.WithLabelValues("replay").Inc()
		return res, nil
	}
	s.returned.Add(int64(res.Returned))
	s.m.returned.Add(float64(res.Returned))
	if res.Returned < req.Count {
		s.insufficient.Add(1)
		s.m.insufficient.Inc()
		s.m.requests.WithLabelValues("partial").Inc()
	} else {
		s.m.requests.WithLabelValues("ok").Inc()
	}
	return res, nil
}

// limit takes req.Count from the client's per-minute budget: in-process a
// one-minute window, with a shared Limiter a GCRA in Redis; what is not
// handed out is refunded after the extraction either way. A Limiter
// that cannot answer refuses the request (fail closed): the extraction
// itself needs the same Redis, so failing open would buy nothing.
func (s *Service) limit(ctx context.Context, req *extraction.Request, perMinute int, now time.Time) error {
	if perMinute <= 0 {
		return nil
	}
	var wait time.Duration
	if s.o.Limiter == nil {
		var ok bool
		if wait, ok = s.rl.take(req.Client, req.Count, perMinute, now); ok {
			return nil
		}
	} else {
		r := coordination.Rate{Limit: perMinute, Period: time.Minute, Burst: perMinute}
		res, err := s.o.Limiter.AllowN(ctx, "extract:"+req.Client, r, req.Count)
		if err != nil {
			s.m.requests.WithLabelValues("error").Inc()
			return fmt.Errorf("checking extraction.perClientPerMinute: %w", err)
		}
		if res.Allowed {
			return nil
		}
		wait = res.RetryAfter
	}
	s.m.requests.WithLabelValues("rate_limited").Inc()
	return &RateLimitError{RetryAfter: wait}
}

// refund gives back n units of the client's budget. A shared budget that
// cannot be reached keeps them: the client waits a little longer, nothing
// is handed out twice.
func (s *Service) refund(ctx context.Context, client string, n, perMinute int, now time.Time) {
	if n <= 0 {
		return
	}
	if s.o.Limiter == nil {
		s.rl.refund(client, n, now)
		return
	}
	r := coordination.Rate{Limit: perMinute, Period: time.Minute, Burst: perMinute}
	if err := s.o.Limiter.RefundN(ctx, "extract:"+client, r, n); err != nil {
		s.o.Logger.Debug("refunding the client's extraction budget", "client", client, "err", err)
	}
}

// extract runs the store extraction, first revoking gateway-owned proxies
// when unowned eligible ones are too few. Revocation happens before the one
// store call so that an idempotency key always maps to a single atomic
// extraction. Extractions are serialised: one running concurrently could
// otherwise take the proxies another just revoked, leaving that one short
// while the gateway still holds spare capacity. The store's atomic
// extraction remains what guarantees a proxy is never returned twice.
func (s *Service) extract(ctx context.Context, req *extraction.Request) (extraction.Result, error) {
	if s.o.Publisher == nil {
		return s.o.Store.Extract(ctx, *req)
	}
	s.extractMu.Lock()
	defer s.extractMu.Unlock()
	if req.IdempotencyKey != "" && s.keys.live(req.IdempotencyKey, s.o.Now()) {
		// A retry of an extraction already made: the store answers it from
		// its record (or refuses a changed request), so revoking gateway
		// capacity first would take it away for nothing.
		return s.o.Store.Extract(ctx, *req)
	}
	unowned, owned, room, err := s.eligible(ctx, req)
	if err != nil {
		return extraction.Result{}, err
	}
	// Hold the unowned eligible proxies back from assignment while this
	// extraction runs: a publish (the one below, or the background loop's)
	// would otherwise hand them to a worker, and the extraction would come
	// up short, or refuse an allOrNothing request, that the pool could fill.
	free := make([]proxy.ID, len(unowned))
	for i := range unowned {
		free[i] = unowned[i].ID
	}
	s.o.Publisher.Exclude(free)
	defer s.o.Publisher.Include(free)
	// What the store could hand out at most: the eligible ones, less what
	// reserveForGateway keeps. Revoking beyond that would only take
	// capacity from the gateway for nothing, and an allOrNothing request
	// that cannot be filled must change nothing at all.
	reachable := min(len(unowned)+len(owned), room)
	if req.Fulfillment == extraction.AllOrNothing && reachable < req.Count {
		return s.o.Store.Extract(ctx, *req)
	}
	short := min(req.Count, reachable) - len(unowned)
	if short <= 0 || len(owned) == 0 {
		return s.o.Store.Extract(ctx, *req)
	}
	ids := pickRevocable(owned, short, s.busy())
	s.o.Publisher.Exclude(ids)
	// Whatever happens, the proxies not extracted go back to the gateway;
	// an extracted one is EXTRACTED and no snapshot can carry it again.
	defer s.o.Publisher.Include(ids)
	if err := s.o.Publisher.Publish(ctx); err != nil {
		return extraction.Result{}, fmt.Errorf("publishing snapshot without revoked proxies: %w", err)
	}
	drained := s.waitDrained(ctx, ids)
	if len(drained) > 0 {
		if err := s.o.Store.SetOwner(ctx, drained, ""); err != nil {
			drained = s.clearEach(ctx, drained)
		}
		s.revoked.Add(int64(len(drained)))
		s.m.revoked.Add(float64(len(drained)))
	}
	return s.o.Store.Extract(ctx, *req)
}

// eligible splits the eligible AVAILABLE proxies by ownership; room is how
// many reserveForGateway lets go (the store counts usable AVAILABLE
// proxies over the upstream filter, owned or not).
func (s *Service) eligible(ctx context.Context, req *extraction.Request) (unowned, owned []proxy.Proxy, room int, err error) {
	ps, err := s.o.Store.List(ctx, activitypool.Filter{States: []proxy.State{proxy.StateAvailable}, Limit: listLimit})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("listing proxies for extraction: %w", err)
	}
	usable := 0
	upstreams := extraction.Filters{Upstreams: req.Filters.Upstreams}
	for i := range ps {
		if upstreams.Eligible(&ps[i], req.Now) {
			usable++
		}
		if !req.Filters.Eligible(&ps[i], req.Now) {
			continue
		}
		if ps[i].Owner == "" {
			unowned = append(unowned, ps[i])
		} else {
			owned = append(owned, ps[i])
		}
	}
	room = len(ps) + 1 // no reserve: never the limit
	if req.ReserveForGateway > 0 {
		room = max(usable-req.ReserveForGateway, 0)
	}
	return unowned, owned, room, nil
}

// pickRevocable chooses n owned proxies, idle ones first, then the ones
// with the most usable time left (what extraction would pick).
func pickRevocable(owned []proxy.Proxy, n int, busy map[proxy.ID]int64) []proxy.ID {
	sort.SliceStable(owned, func(i, j int) bool {
		bi, bj := busy[owned[i].ID], busy[owned[j].ID]
		if bi != bj {
			return bi < bj
		}
		return owned[i].UsableUntil.After(owned[j].UsableUntil)
	})
	n = min(n, len(owned))
	ids := make([]proxy.ID, n)
	for i := range n {
		ids[i] = owned[i].ID
	}
	return ids
}

// busy sums active and reserved capacity per proxy over all workers.
func (s *Service) busy() map[proxy.ID]int64 {
	out := map[proxy.ID]int64{}
	for _, w := range s.o.Workers() {
		for _, r := range w.Runtime() {
			if n := r.Active + r.Reserved; n > 0 {
				out[r.ID] += n
			}
		}
	}
	return out
}

// waitDrained polls the workers until none holds capacity on ids or the
// wait bound passes; it returns the ids that drained.
func (s *Service) waitDrained(ctx context.Context, ids []proxy.ID) []proxy.ID {
	deadline := time.NewTimer(s.o.RevokeWait)
	defer deadline.Stop()
	tick := time.NewTicker(revokePoll)
	defer tick.Stop()
	for {
		busy := s.busy()
		var idle []proxy.ID
		for _, id := range ids {
			if busy[id] == 0 {
				idle = append(idle, id)
			}
		}
		if len(idle) == len(ids) {
			return idle
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return idle
		case <-ctx.Done():
			return nil
		}
	}
}

// clearEach clears ownership one by one when the batch failed (a proxy
// changed state meanwhile) and returns those cleared.
func (s *Service) clearEach(ctx context.Context, ids []proxy.ID) []proxy.ID {
	var out []proxy.ID
	for _, id := range ids {
		if err := s.o.Store.SetOwner(ctx, []proxy.ID{id}, ""); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// limiter is a fixed one-minute window per client over proxies handed out,
// with a bounded client table: when full, the entry with the oldest window
// is evicted (its client simply starts a fresh window).
type limiter struct {
	mu      sync.Mutex
	max     int
	clients map[string]*window
}

type window struct {
	start time.Time
	used  int
}

func newLimiter(maxClients int) *limiter {
	return &limiter{max: maxClients, clients: map[string]*window{}}
}

// take reserves n for client; on refusal it returns when to retry.
func (l *limiter) take(client string, n, perMinute int, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.clients[client]
	if w == nil || now.Sub(w.start) >= time.Minute {
		if w == nil && len(l.clients) >= l.max {
			l.evictLocked()
		}
		w = &window{start: now}
		l.clients[client] = w
	}
	if w.used+n > perMinute {
		return w.start.Add(time.Minute).Sub(now), false
	}
	w.used += n
	return 0, true
}

func (l *limiter) refund(client string, n int, now time.Time) {
	if n <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.clients[client]; w != nil && now.Sub(w.start) < time.Minute {
		w.used = max(w.used-n, 0)
	}
}

func (l *limiter) evictLocked() {
	var (
		oldest string
		at     time.Time
	)
	for c, w := range l.clients {
		if oldest == "" || w.start.Before(at) {
			oldest, at = c, w.start
		}
	}
	delete(l.clients, oldest)
}

// expiring is a bounded set of keys with an expiry; when full, the entry
// expiring first is evicted.
type expiring struct {
	mu   sync.Mutex
	max  int
	keys map[string]time.Time
}

func newExpiring(n int) *expiring { return &expiring{max: n, keys: map[string]time.Time{}} }

func (e *expiring) put(k string, until, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.keys[k]; !ok && len(e.keys) >= e.max {
		var first string
		for key, at := range e.keys {
			if !now.Before(at) { // expired: any will do
				first = key
				break
			}
			if first == "" || at.Before(e.keys[first]) {
				first = key
			}
		}
		delete(e.keys, first)
	}
	e.keys[k] = until
}

func (e *expiring) live(k string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	until, ok := e.keys[k]
	if ok && !now.Before(until) {
		delete(e.keys, k)
		return false
	}
	return ok
}

type metrics struct {
	requests     *prometheus.CounterVec
	returned     prometheus.Counter
	insufficient prometheus.Counter
	replays      prometheus.Counter
	revoked      prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "proxypool", Subsystem: "extraction", Name: name, Help: help})
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "extraction", Name: "requests_total",
			Help: "Extraction requests by result.",
		}, []string{"result"}),
		returned:     c("returned_total", "Proxies handed out by extraction."),
		insufficient: c("insufficient_total", "Extractions that returned fewer proxies than requested, or none (allOrNothing)."),
		replays:      c("idempotent_replays_total", "Extractions answered from an idempotency record."),
		revoked:      c("revoked_total", "Gateway-owned proxies revoked so they could be extracted."),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.returned, m.insufficient, m.replays, m.revoked)
	}
	return m
}

var _ Store = activitypool.Pool(nil)
