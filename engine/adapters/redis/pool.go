package redisstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Pool is the Redis activity pool. It implements activitypool.Pool with the
// embedded pool's semantics (the contract suite pins them):
//   - IDs are proxy.MakeID(Key); Admit derives an empty one and refuses a
//     mismatching one, changing nothing.
//   - A key belongs to one lifecycle until its entry is EXPIRED or
//     REMOVED or its ExpiresAt has passed by the Redis server clock;
//     until then a re-admission from any upstream is a duplicate.
//   - Managed is every state but EXTRACTED, EXPIRED and REMOVED.
//   - Extraction order: UsableUntil descending, ties newest admission
//     first; reserveForGateway counts usable AVAILABLE proxies, owned or
//     not, over the request's upstream filter; only unowned proxies are
//     extracted; a failed allOrNothing records nothing.
//   - SetOwner is all or nothing; assigning needs AVAILABLE and no other
//     owner; clearing works in any state.
//
// Every proxy key expires server-side at max(ExpiresAt, admission) plus
// HardExpiryGrace, so a pool nobody tends still empties itself; Sweep
// removes what key expiry leaves behind in the indexes.
type Pool struct {
	*core
	feed feedState
}

// Open connects with the storage.redis section of a validated config (its
// secrets resolved). Close releases the connections.
func Open(ctx context.Context, c config.Redis) (*Pool, error) {
	return OpenWith(ctx, c, Options{})
}

// OpenWith is Open with options. With a Logger it also becomes the
// destination of the go-redis client's own messages (process-wide: the
// library has one logger).
func OpenWith(ctx context.Context, c config.Redis, o Options) (*Pool, error) {
	if o.Logger != nil {
		redis.SetLogger(clientLog{o.Logger})
	}
	rdb, err := NewClient(c)
	if err != nil {
		return nil, err
	}
	p, err := New(ctx, rdb, o)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	p.owns = true
	return p, nil
}

// New returns a pool on an existing client, which Close leaves open. It
// reads (or creates) the generation, so an unreachable server fails here.
func New(ctx context.Context, rdb redis.UniversalClient, o Options) (*Pool, error) {
	c, err := newCore(ctx, rdb, o)
	if err != nil {
		return nil, err
	}
	return &Pool{core: c}, nil
}

// Coordinator returns the coordination API on the same client, namespace
// and generation.
func (p *Pool) Coordinator() *Coordinator { return &Coordinator{core: p.core} }

// Client is the underlying go-redis client.
func (p *Pool) Client() redis.UniversalClient { return p.rdb }

// Close releases the client when Open created it.
func (p *Pool) Close() error {
	if p.owns {
		return p.rdb.Close()
	}
	return nil
}

// Ping checks the server answers within the operation timeout.
func (p *Pool) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.OpTimeout)
	defer cancel()
	if err := p.rdb.Ping(ctx).Err(); err != nil {
		return unavailable("ping redis", err)
	}
	return nil
}

func admitID(p *proxy.Proxy) (proxy.ID, error) {
	if !p.Key.Scheme.Valid() || p.Key.Host == "" || p.Key.Port == 0 {
		return "", fmt.Errorf("invalid proxy key %s", p.Key)
	}
	want := proxy.MakeID(p.Key)
	if p.ID != "" && p.ID != want {
		return "", fmt.Errorf("proxy id %q does not match its key %s", p.ID, p.Key)
	}
	if p.ExpiresAt.IsZero() {
		return "", fmt.Errorf("proxy %s has no expiry", want)
	}
	return want, nil
}

// Admit implements activitypool.Pool. The batch is validated first and
// admitted in one script, so an invalid element changes nothing.
func (p *Pool) Admit(ctx context.Context, up string, ps []proxy.Proxy, maxSize int) (activitypool.AdmitResult, error) {
	var res activitypool.AdmitResult
	what := fmt.Sprintf("admit to upstream %q", up)
	if up == "" {
		return res, errors.New("admit: empty upstream name")
	}
	args := make([]any, 0, 4+14*len(ps))
	args = append(args, up, strconv.Itoa(max(maxSize, 0)), strconv.FormatInt(p.opts.HardExpiryGrace.Milliseconds(), 10), strconv.Itoa(len(ps)))
	for i := range ps {
		id, err := admitID(&ps[i])
		if err != nil {
			return res, fmt.Errorf("%s: %w", what, err)
		}
		a, err := admitArgs(&ps[i], id)
		if err != nil {
			return res, fmt.Errorf("%s: %w", what, err)
		}
		args = append(args, a...)
	}
	if len(ps) == 0 {
		return res, nil
	}
	r, err := p.run(ctx, scriptAdmit, what, p.Generation(), args...)
	if err != nil {
		return res, err
	}
	res.Duplicates = int(toInt(r[1]))
	res.Full = int(toInt(r[2]))
	added, _ := r[3].([]any)
	for _, a := range added {
		res.Added = append(res.Added, proxy.ID(toStr(a)))
	}
	return res, nil
}

func (p *Pool) pkey(id proxy.ID) string { return p.k + "p:" + string(id) }

// Get implements activitypool.Pool.
func (p *Pool) Get(ctx context.Context, id proxy.ID) (proxy.Proxy, error) {
	what := fmt.Sprintf("get proxy %s", id)
	if err := ctx.Err(); err != nil {
		return proxy.Proxy{}, fmt.Errorf("%s: %w", what, err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.OpTimeout)
	defer cancel()
	m, err := p.rdb.HGetAll(cctx, p.pkey(id)).Result()
	if err != nil {
		return proxy.Proxy{}, p.readErr(ctx, what, err)
	}
	if len(m) == 0 {
		return proxy.Proxy{}, fmt.Errorf("%s: %w", what, activitypool.ErrNotFound)
	}
	return decodeMap(m)
}

func (p *Pool) readErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return unavailable(what, err)
}

// List implements activitypool.Pool: the live members of the state indexes
// of the upstream (or every upstream), read in pipelined batches and
// sorted by ID. Without a Limit, MaxList bounds the result.
func (p *Pool) List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error) {
	const what = "list proxies"
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.OpTimeout)
	defer cancel()
	ups := []string{f.Upstream}
	if f.Upstream == "" {
		var err error
		if ups, err = p.rdb.SMembers(cctx, p.k+"ups").Result(); err != nil {
			return nil, p.readErr(ctx, what, err)
		}
	}
	states := f.States
	if len(states) == 0 {
		states = proxy.States()
	}
	limit := p.opts.MaxList
	if f.Limit > 0 {
		limit = min(f.Limit, limit)
	}
	now, err := p.rdb.Time(cctx).Result()
	if err != nil {
		return nil, p.readErr(ctx, what, err)
	}
	floor := strconv.FormatInt(now.UnixMilli(), 10)
	var ids []string
	for _, up := range ups {
		for _, st := range slices.Compact(slices.Sorted(slices.Values(states))) {
			if len(ids) >= limit {
				break
			}
			got, err := p.rdb.ZRangeByScore(cctx, p.k+"u:"+up+":s:"+strconv.Itoa(int(st)), &redis.ZRangeBy{
				Min: floor, Max: "+inf", Count: int64(limit - len(ids)),
			}).Result()
			if err != nil {
				return nil, p.readErr(ctx, what, err)
			}
			ids = append(ids, got...)
		}
	}
	out := make([]proxy.Proxy, 0, len(ids))
	for chunk := range slices.Chunk(ids, 1000) {
		pipe := p.rdb.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(chunk))
		for i, id := range chunk {
			cmds[i] = pipe.HGetAll(cctx, p.pkey(proxy.ID(id)))
		}
		if _, err := pipe.Exec(cctx); err != nil {
			return nil, p.readErr(ctx, what, err)
		}
		for _, c := range cmds {
			m := c.Val()
			if len(m) == 0 {
				continue // expired between the index read and now
			}
			px, err := decodeMap(m)
			if err != nil {
				return nil, err
			}
			if len(f.States) > 0 && !slices.Contains(f.States, px.State) {
				continue
			}
			out = append(out, px)
		}
	}
	slices.SortFunc(out, func(a, b proxy.Proxy) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// casErr translates a script's refusal into the contract's errors.
func casErr(what string, r []any, from, to proxy.State) error {
	switch status(r) {
	case "OK":
		return nil
	case "NF":
		return fmt.Errorf("%s: %w", what, activitypool.ErrNotFound)
	case "CF":
		return fmt.Errorf("%s %s -> %s: state is %s: %w", what, from, to, proxy.State(toInt(r[1])), activitypool.ErrConflict)
	}
	return fmt.Errorf("%s: unexpected reply %v", what, r)
}

// Transition implements activitypool.Pool: the edge is validated first,
// then the ID, then the current state, in one script. at is recorded as
// ExtractedAt on a move to EXTRACTED.
func (p *Pool) Transition(ctx context.Context, id proxy.ID, from, to proxy.State, at time.Time) error {
	what := fmt.Sprintf("transition proxy %s", id)
	if err := proxy.Transition(from, to); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	r, err := p.run(ctx, scriptTransition, what, p.Generation(), string(id), int(from), int(to), micros(at))
	if err != nil {
		return err
	}
	return casErr(what, r, from, to)
}

// RecordHealth implements activitypool.Pool. From == To records an
// observation without moving; Latency and LastSuccessAt change on success
// only.
func (p *Pool) RecordHealth(ctx context.Context, h activitypool.Health) error {
	what := fmt.Sprintf("record health of proxy %s", h.ID)
	if h.From != h.To {
		if err := proxy.Transition(h.From, h.To); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	ok := "0"
	if h.Success {
		ok = "1"
	}
	r, err := p.run(ctx, scriptHealth, what, p.Generation(), string(h.ID), int(h.From), int(h.To),
		micros(h.CheckedAt), ok, int64(h.Latency), h.Fails)
	if err != nil {
		return err
	}
	return casErr(what, r, h.From, h.To)
}

// Remove implements activitypool.Pool: from EXPIRED, UNHEALTHY or REMOVED.
func (p *Pool) Remove(ctx context.Context, id proxy.ID) error {
	what := fmt.Sprintf("remove proxy %s", id)
	r, err := p.run(ctx, scriptRemove, what, p.Generation(), string(id))
	if err != nil {
		return err
	}
	switch status(r) {
	case "OK":
		return nil
	case "NF":
		return fmt.Errorf("%s: %w", what, activitypool.ErrNotFound)
	case "TE":
		return fmt.Errorf("%s: %w", what, &proxy.TransitionError{From: proxy.State(toInt(r[1])), To: proxy.StateRemoved})
	}
	return fmt.Errorf("%s: unexpected reply %v", what, r)
}

// SetOwner implements activitypool.Pool, all or nothing. Without a lease it
// is not fenced: OwnerLease and AssignOwner add the multi-worker fence.
func (p *Pool) SetOwner(ctx context.Context, ids []proxy.ID, owner string) error {
	return p.setOwner(ctx, ids, owner, "", 0)
}

func (p *Pool) setOwner(ctx context.Context, ids []proxy.ID, owner, leaseWorker string, epoch int64) error {
	const what = "set owner"
	args := make([]any, 0, 3+len(ids))
	args = append(args, owner, leaseWorker, strconv.FormatInt(epoch, 10))
	for _, id := range ids {
		args = append(args, string(id))
	}
	if len(ids) == 0 {
		return nil
	}
	r, err := p.run(ctx, scriptSetOwner, what, p.Generation(), args...)
	if err != nil {
		return err
	}
	switch status(r) {
	case "OK":
		return nil
	case "LEASE":
		return fmt.Errorf("%s for worker %q: %w", what, leaseWorker, ErrLeaseLost)
	case "NF":
		return fmt.Errorf("set owner of proxy %s: %w", toStr(r[1]), activitypool.ErrNotFound)
	case "CF":
		return fmt.Errorf("set owner of proxy %s: state is %s: %w", toStr(r[1]), proxy.State(toInt(r[2])), activitypool.ErrConflict)
	case "OWNED":
		return fmt.Errorf("set owner of proxy %s: owned by another worker: %w", toStr(r[1]), activitypool.ErrConflict)
	}
	return fmt.Errorf("%s: unexpected reply %v", what, r)
}

// Counts implements activitypool.Pool; every state is present.
func (p *Pool) Counts(ctx context.Context) (map[proxy.State]int, error) {
	r, err := p.run(ctx, scriptCounts, "count proxies", p.Generation())
	if err != nil {
		return nil, err
	}
	vals, _ := r[1].([]any)
	out := make(map[proxy.State]int, len(vals))
	for i, s := range proxy.States() {
		if i < len(vals) {
			out[s] = int(toInt(vals[i]))
		}
	}
	return out, nil
}

// Inventory implements activitypool.Pool in O(log n + min(usable,
// unusable AVAILABLE)): Managed and Pending count the state indexes,
// Available and AvailableSlots come from the upstream's AVAILABLE index
// and its running slot sum. Worker active/reserved are the controller's to
// subtract.
func (p *Pool) Inventory(ctx context.Context, up string, now time.Time) (upstream.Inventory, error) {
	what := fmt.Sprintf("inventory of upstream %q", up)
	r, err := p.run(ctx, scriptInventory, what, p.Generation(), up, micros(now))
	if err != nil {
		return upstream.Inventory{}, err
	}
	return upstream.Inventory{
		Managed:        int(toInt(r[1])),
		Available:      int(toInt(r[2])),
		AvailableSlots: toInt(r[3]),
		Pending:        int(toInt(r[4])),
	}, nil
}

// fingerprint is what makes two extraction requests "the same" for an
// idempotency key, exactly the embedded pool's: ReserveForGateway,
// IdempotencyTTL and Now come from configuration and the clock and are
// left out; the upstream filter is a set.
func fingerprint(r *extraction.Request) string {
	ups := slices.Compact(slices.Sorted(slices.Values(r.Filters.Upstreams)))
	h := sha256.New()
	fmt.Fprintf(h, "%q\x00%d\x00%q\x00%q\x00%q\x00%q\x00%q\x00%d\x00%d",
		r.Client, r.Count, r.Fulfillment, r.Filters.Protocol, r.Filters.Region, r.Filters.Carrier,
		strings.Join(ups, "\x00"), r.Filters.MinRemainingTTL, r.Filters.MaxHealthCheckAge)
	return hex.EncodeToString(h.Sum(nil))
}

// Extract implements activitypool.Pool in one Lua script: idempotent
// replay, selection over the free (unowned AVAILABLE) index ordered by
// UsableUntil, the reserve check, the moves to EXTRACTED and the
// idempotency record with its TTL. A request costs O(log n + examined).
//
// The client never retries the script; if the reply is lost (the
// connection dropped after Redis ran it) the proxies are consumed and the
// caller gets ErrUnavailable: retrying with the same idempotency key
// returns them.
func (p *Pool) Extract(ctx context.Context, req extraction.Request) (extraction.Result, error) {
	const what = "extract"
	if err := req.Validate(); err != nil {
		return extraction.Result{}, fmt.Errorf("%s: %w", what, err)
	}
	ttl := req.IdempotencyTTL
	if ttl <= 0 {
		ttl = p.opts.IdempotencyTTL
	}
	aon := "0"
	if req.Fulfillment == extraction.AllOrNothing {
		aon = "1"
	}
	ups := slices.Compact(slices.Sorted(slices.Values(req.Filters.Upstreams)))
	args := make([]any, 0, 14+len(ups))
	args = append(args, micros(req.Now), req.Count, aon, max(req.ReserveForGateway, 0), req.Client,
		fingerprint(&req), req.IdempotencyKey, ttl.Milliseconds(), string(req.Filters.Protocol),
		req.Filters.Region, req.Filters.Carrier, req.Filters.MinRemainingTTL.Microseconds(),
		req.Filters.MaxHealthCheckAge.Microseconds(), p.opts.MaxExamined)
	for _, u := range ups {
		args = append(args, u)
	}
	r, err := p.run(ctx, scriptExtract, what, p.Generation(), args...)
	if err != nil {
		return extraction.Result{}, err
	}
	switch status(r) {
	case "IC":
		return extraction.Result{}, fmt.Errorf("%s: %w", what, extraction.ErrIdempotencyConflict)
	case "IN":
		return extraction.Result{}, fmt.Errorf("%s: %w", what, &extraction.InsufficientError{Requested: req.Count, Available: int(toInt(r[1]))})
	case "F", "R":
		var ps []proxy.Proxy
		if status(r) == "F" {
			ps, err = decodeRows(r[1:])
		} else {
			ps, err = decodePayload(toStr(r[1]))
		}
		if err != nil {
			return extraction.Result{}, fmt.Errorf("%s: %w", what, err)
		}
		return extraction.Result{Requested: req.Count, Returned: len(ps), Proxies: ps, Replayed: status(r) == "R"}, nil
	}
	return extraction.Result{}, fmt.Errorf("%s: unexpected reply %v", what, r)
}

// SweepResult reports one Sweep.
type SweepResult struct {
	// Removed entries were in REMOVED and are now deleted.
	Removed int
	// Ghosts are index members whose proxy key Redis had already expired.
	Ghosts int
}

// Sweep is the housekeeping key TTLs cannot do (the embedded pool's Sweep
// equivalent): it deletes REMOVED entries, drops index members of keys
// Redis expired (correcting slot sums, recording the changes), forgets
// emptied upstreams and trims the change log to MaxChangeLog. It
// examines at most a bounded number of members per index; the controller
// calls it periodically.
func (p *Pool) Sweep(ctx context.Context) (SweepResult, error) {
	r, err := p.run(ctx, scriptSweep, "sweep activity pool", p.Generation(), sweepBatch, p.opts.MaxChangeLog, changeTrimBatch)
	if err != nil {
		return SweepResult{}, err
	}
	return SweepResult{Removed: int(toInt(r[1])), Ghosts: int(toInt(r[2]))}, nil
}

var _ activitypool.Pool = (*Pool)(nil)

// Namespace is the key namespace (keys are "{namespace}:<layout>:…").
func (p *Pool) Namespace() string { return p.opts.Namespace }
