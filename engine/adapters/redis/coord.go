package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/engine/domain/coordination"
)

// Coordinator is the cluster coordination of seed 000 §8 and §12.2 on
// Redis: the provider fetch leader lease per upstream (generation +
// monotonic epoch fence), the requestInterval / maxInFlight / maxTotal
// decisions taken atomically under that fence, client rate limits and
// worker heartbeats. Redis is the only arbiter: every uncertainty — a
// timeout, a lost connection, a generation change, a lease past its local
// deadline — fails closed, and nothing here ever falls back to a local
// leader.
type Coordinator struct {
	*core
}

// The coordination types and policy errors are the domain's
// (engine/domain/coordination), so the controller can consume them
// without importing this package.
type (
	Lease         = coordination.Lease
	PermitRequest = coordination.PermitRequest
	Permit        = coordination.Permit
	Ledger        = coordination.Ledger
	Rate          = coordination.Rate
	RateResult    = coordination.RateResult
	WorkerBeat    = coordination.WorkerBeat
	// WaitError says the upstream's requestInterval has not passed; retry
	// after RetryAfter.
	WaitError = coordination.WaitError
)

// Coordination errors.
var (
	// ErrInFlightFull: maxInFlight permits are out.
	ErrInFlightFull = coordination.ErrInFlightFull
	// ErrBudgetExhausted: settled plus pending plus this call's expected
	// amount would pass fetch.maxTotal.
	ErrBudgetExhausted = coordination.ErrBudgetExhausted
)

// AcquireLeader makes holder the upstream's fetch leader for ttl with a new
// epoch, unless a live lease exists (ErrLeaseHeld, whoever holds it: even
// the same holder takes a new term only after its lease ends). Holder
// names must be unique per process incarnation.
func (c *Coordinator) AcquireLeader(ctx context.Context, upstream, holder string, ttl time.Duration) (Lease, error) {
	what := fmt.Sprintf("acquire fetch leadership of upstream %q", upstream)
	if upstream == "" || holder == "" {
		return Lease{}, fmt.Errorf("%s: empty upstream or holder", what)
	}
	if err := checkTTL(ttl); err != nil {
		return Lease{}, fmt.Errorf("%s: %w", what, err)
	}
	gen, sent := c.Generation(), time.Now()
	r, err := c.run(ctx, scriptLeadAcquire, what, gen, upstream, holder, ttl.Milliseconds())
	if err != nil {
		return Lease{}, err
	}
	if status(r) == "HELD" {
		return Lease{}, fmt.Errorf("%s: held by %q epoch %d: %w", what, toStr(r[1]), toInt(r[2]), ErrLeaseHeld)
	}
	return Lease{
		Upstream: upstream, Holder: holder, Generation: gen, Epoch: toInt(r[1]),
		ExpiresAt: fromMicros(toStr(r[2])), ValidUntil: localDeadline(sent, ttl),
	}, nil
}

// RenewLeader extends a live lease, keeping its epoch. Any error means the
// holder must stop leading: ErrLeaseLost when Redis says so, ErrUnavailable
// when it cannot tell (fail closed).
func (c *Coordinator) RenewLeader(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	what := fmt.Sprintf("renew fetch leadership of upstream %q", l.Upstream)
	if err := checkTTL(ttl); err != nil {
		return Lease{}, fmt.Errorf("%s: %w", what, err)
	}
	sent := time.Now()
	r, err := c.run(ctx, scriptLeadRenew, what, l.Generation, l.Upstream, l.Holder, strconv.FormatInt(l.Epoch, 10), ttl.Milliseconds())
	if err != nil {
		return Lease{}, leaseGenErr(err)
	}
	if status(r) == "LOST" {
		return Lease{}, fmt.Errorf("%s: epoch %d: %w", what, l.Epoch, ErrLeaseLost)
	}
	l.ExpiresAt, l.ValidUntil = fromMicros(toStr(r[1])), localDeadline(sent, ttl)
	return l, nil
}

// CheckLeader verifies that l is still the current lease.
func (c *Coordinator) CheckLeader(ctx context.Context, l Lease) error {
	what := fmt.Sprintf("check fetch leadership of upstream %q", l.Upstream)
	if !l.Valid(time.Now()) {
		return fmt.Errorf("%s: past its local deadline: %w", what, ErrLeaseLost)
	}
	r, err := c.run(ctx, scriptLeadRenew, what, l.Generation, l.Upstream, l.Holder, strconv.FormatInt(l.Epoch, 10), "-1")
	if err != nil {
		return leaseGenErr(err)
	}
	if status(r) == "LOST" {
		return fmt.Errorf("%s: %w", what, ErrLeaseLost)
	}
	return nil
}

// ReleaseLeader ends a lease so another controller can lead at once.
func (c *Coordinator) ReleaseLeader(ctx context.Context, l Lease) error {
	what := fmt.Sprintf("release fetch leadership of upstream %q", l.Upstream)
	r, err := c.run(ctx, scriptLeadRenew, what, l.Generation, l.Upstream, l.Holder, strconv.FormatInt(l.Epoch, 10), "0")
	if err != nil {
		return leaseGenErr(err)
	}
	if status(r) == "LOST" {
		return fmt.Errorf("%s: %w", what, ErrLeaseLost)
	}
	return nil
}

// AcquirePermit decides, atomically and under the leader fence, whether the
// leader may call the provider now: expired permits are booked at their
// expected amount, then requestInterval (*WaitError), maxInFlight
// (ErrInFlightFull) and the maxTotal ledger (ErrBudgetExhausted) are
// checked, and the permit reserves Expected. A stale lease gets
// ErrLeaseLost.
func (c *Coordinator) AcquirePermit(ctx context.Context, l Lease, r PermitRequest) (Permit, error) {
	what := fmt.Sprintf("acquire fetch permit for upstream %q", l.Upstream)
	if !l.Valid(time.Now()) {
		return Permit{}, fmt.Errorf("%s: lease past its local deadline: %w", what, ErrLeaseLost)
	}
	if r.TTL < time.Millisecond || r.Expected < 0 || r.MaxInFlight < 0 || r.MaxTotal < 0 || r.RequestInterval < 0 {
		return Permit{}, fmt.Errorf("%s: invalid request %+v", what, r)
	}
	res, err := c.run(ctx, scriptPermit, what, l.Generation, l.Upstream, l.Holder, strconv.FormatInt(l.Epoch, 10),
		r.RequestInterval.Microseconds(), r.MaxInFlight, r.MaxTotal, r.Expected, r.TTL.Milliseconds())
	if err != nil {
		return Permit{}, leaseGenErr(err)
	}
	switch status(res) {
	case "OK":
		return Permit{
			ID: toInt(res[1]), Upstream: l.Upstream, Generation: l.Generation, Epoch: l.Epoch,
			Expected: r.Expected, ExpiresAt: time.UnixMilli(toInt(res[2])).UTC(),
		}, nil
	case "LOST":
		return Permit{}, fmt.Errorf("%s: %w", what, ErrLeaseLost)
	case "WAIT":
		return Permit{}, fmt.Errorf("%s: %w", what, &WaitError{RetryAfter: time.Duration(toInt(res[1])) * time.Microsecond})
	case "FULL":
		return Permit{}, fmt.Errorf("%s: %d in flight: %w", what, toInt(res[1]), ErrInFlightFull)
	case "BUDGET":
		return Permit{}, fmt.Errorf("%s: %d settled, %d pending: %w", what, toInt(res[1]), toInt(res[2]), ErrBudgetExhausted)
	}
	return Permit{}, fmt.Errorf("%s: unexpected reply %v", what, res)
}

// SettlePermit books a finished call: actual valid proxies when known,
// otherwise (timeout, parse failure, a lost result) the permit's expected
// amount. It is idempotent and does not need the leadership: a permit of
// an earlier leader settles once, and one that expired was already booked
// at its expected amount (settled reports false then). An actual beyond
// Expected is booked as is, so the ledger stops later calls.
func (c *Coordinator) SettlePermit(ctx context.Context, p Permit, actual int64, known bool) (settled bool, err error) {
	what := fmt.Sprintf("settle fetch permit %d of upstream %q", p.ID, p.Upstream)
	a := ""
	if known {
		if actual < 0 {
			return false, fmt.Errorf("%s: negative count %d", what, actual)
		}
		a = strconv.FormatInt(actual, 10)
	}
	r, err := c.run(ctx, scriptSettle, what, p.Generation, p.Upstream, strconv.FormatInt(p.ID, 10), a)
	if err != nil {
		return false, err
	}
	return toInt(r[1]) == 1, nil
}

// Ledger reads an upstream's ledger.
func (c *Coordinator) Ledger(ctx context.Context, upstream string) (Ledger, error) {
	r, err := c.run(ctx, scriptLedger, fmt.Sprintf("read fetch ledger of upstream %q", upstream), c.Generation(), upstream)
	if err != nil {
		return Ledger{}, err
	}
	return Ledger{Total: toInt(r[1]), Pending: toInt(r[2]), InFlight: int(toInt(r[3])), Expired: toInt(r[4])}, nil
}

// Allow takes one unit from key's budget (GCRA, one key per client, shared
// by every controller). Keys are client names, bounded by configuration.
func (c *Coordinator) Allow(ctx context.Context, key string, r Rate) (RateResult, error) {
	return c.AllowN(ctx, key, r, 1)
}

// AllowN takes n units at once, or none: one GCRA arrival costing n
// emission intervals against the same tolerance of Burst units (the
// script's burst count is Burst/n, a Lua double), so mixed request sizes
// share one budget of Limit units per Period. More than Burst units can
// never pass: refused, retry after Period. Remaining is in units, rounded
// down to whole requests of n.
func (c *Coordinator) AllowN(ctx context.Context, key string, r Rate, n int) (RateResult, error) {
	what := "client rate limit"
	if r.Limit <= 0 || r.Period <= 0 || r.Burst < 1 || key == "" || n < 1 {
		return RateResult{}, fmt.Errorf("%s: invalid rate %+v of %d for %q", what, r, n, key)
	}
	if n > r.Burst {
		return RateResult{RetryAfter: r.Period}, nil
	}
	emission := max(r.Period.Microseconds()/int64(r.Limit), 1)
	burst := strconv.FormatFloat(float64(r.Burst)/float64(n), 'f', -1, 64)
	res, err := c.run(ctx, scriptRateLimit, what, c.Generation(), key, emission*int64(n), burst)
	if err != nil {
		return RateResult{}, err
	}
	return RateResult{
		Allowed:    toInt(res[1]) == 1,
		Remaining:  int(toInt(res[2])) * n,
		RetryAfter: time.Duration(toInt(res[3])) * time.Microsecond,
	}, nil
}

// RefundN gives back n units AllowN took from key's budget and the caller
// did not use (an extraction that returned fewer proxies than it asked
// for): the arrival time moves back n emission intervals, never before
// now, so a refund can never raise the budget above what it was.
func (c *Coordinator) RefundN(ctx context.Context, key string, r Rate, n int) error {
	what := "client rate limit refund"
	if r.Limit <= 0 || r.Period <= 0 || key == "" || n < 0 {
		return fmt.Errorf("%s: invalid rate %+v of %d for %q", what, r, n, key)
	}
	if n == 0 {
		return nil
	}
	emission := max(r.Period.Microseconds()/int64(r.Limit), 1)
	_, err := c.run(ctx, scriptRateRefund, what, c.Generation(), key, emission*int64(n))
	return err
}

// MaxWorkers bounds Workers.
const MaxWorkers = 10_000

// Heartbeat records that worker is alive for ttl, with a small info map
// (version, snapshot epoch...). Never put addresses or secrets in it.
func (c *Coordinator) Heartbeat(ctx context.Context, worker string, ttl time.Duration, info map[string]string) error {
	what := fmt.Sprintf("heartbeat of worker %q", worker)
	if worker == "" {
		return fmt.Errorf("%s: empty worker", what)
	}
	if err := checkTTL(ttl); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	args := []any{worker, ttl.Milliseconds()}
	for k, v := range info {
		if k == "" || k[0] == '_' {
			return fmt.Errorf("%s: info key %q is reserved", what, k)
		}
		args = append(args, k, v)
	}
	_, err := c.run(ctx, scriptHeartbeat, what, c.Generation(), args...)
	return err
}

// Workers lists live workers (at most MaxWorkers) and forgets dead ones.
func (c *Coordinator) Workers(ctx context.Context) ([]WorkerBeat, error) {
	r, err := c.run(ctx, scriptWorkers, "list workers", c.Generation(), MaxWorkers)
	if err != nil {
		return nil, err
	}
	rows, _ := r[1].([]any)
	out := make([]WorkerBeat, 0, len(rows))
	for _, row := range rows {
		f, _ := row.([]any)
		if len(f) != 3 {
			continue
		}
		w := WorkerBeat{Worker: toStr(f[0]), ExpiresAt: time.UnixMilli(int64(parseFloat(f[1]))).UTC(), Info: map[string]string{}}
		kv, _ := f[2].([]any)
		for i := 0; i+1 < len(kv); i += 2 {
			k, v := toStr(kv[i]), toStr(kv[i+1])
			if k == "_at" {
				n, _ := strconv.ParseInt(v, 10, 64)
				w.At = time.UnixMilli(n).UTC()
				continue
			}
			w.Info[k] = v
		}
		out = append(out, w)
	}
	return out, nil
}

func parseFloat(v any) float64 {
	switch x := v.(type) {
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	case int64:
		return float64(x)
	case float64:
		return x
	}
	return 0
}
