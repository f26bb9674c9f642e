package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
)

// ErrUnavailable wraps every failure to reach Redis (refused, timed out,
// connection lost mid-command): the caller stops fetching, extracting and
// changing ownership (seed 000 §18) and retries later. It is the domain's
// activitypool.ErrUnavailable, so callers need not import this package.
var ErrUnavailable = activitypool.ErrUnavailable

// ErrGenerationChanged is returned by an operation that found Redis on
// another generation than the one this process knew: Redis lost its state
// (a restart without persistence, a flush, a failover to an empty replica)
// or another process already detected that and started a new generation.
// The operation changed nothing; the store has adopted the new generation,
// so a retry runs against it. Everything learned before — proxy IDs,
// leases, permits, ownership — belongs to the old generation and is void.
var ErrGenerationChanged = errors.New("redis generation changed: state was lost")

// GenerationError carries both generations; errors.Is(err,
// ErrGenerationChanged) holds.
type GenerationError struct{ Old, New string }

func (e *GenerationError) Error() string {
	return fmt.Sprintf("redis generation changed from %s to %s: state was lost", e.Old, e.New)
}

// Is makes errors.Is(err, ErrGenerationChanged) and errors.Is(err,
// activitypool.ErrStateLost) true.
func (e *GenerationError) Is(target error) bool {
	return target == ErrGenerationChanged || target == activitypool.ErrStateLost
}

// Client defaults; every bound is explicit so an unreachable server turns
// into an error within OpTimeout rather than a hang.
const (
	DefaultNamespace   = "proxypool"
	DefaultDialTimeout = 2 * time.Second
	DefaultIOTimeout   = 2 * time.Second
	DefaultOpTimeout   = 3 * time.Second
	DefaultPoolSize    = 64
)

// Options tune the store; zero values take the defaults.
type Options struct {
	// Namespace prefixes every key as "{namespace}:<layout>:"; the braces
	// are a hash tag that puts all keys in one cluster slot (the scripts
	// touch many keys at once).
	// Two fleets, or two tests, sharing a server use two namespaces.
	Namespace string
	// OpTimeout bounds every operation, whatever the caller's context.
	OpTimeout time.Duration
	// HardExpiryGrace is how long past ExpiresAt (or past admission, when
	// already expired) a proxy's key lives before Redis deletes it.
	HardExpiryGrace time.Duration
	// IdempotencyTTL applies when a request carries a key but no TTL.
	IdempotencyTTL time.Duration
	// MaxExamined bounds the candidates one extraction examines, so a
	// filter matching nothing in a huge pool cannot stall Redis; past it
	// the extraction acts as if the pool were exhausted.
	MaxExamined int
	// MaxList bounds List without a Limit, and the proxies one Changes
	// answer reads (past it the answer is a Reset: listing costs no more).
	MaxList int
	// MaxChangeLog bounds the change log Changes reads: Changes and Sweep
	// trim it to the latest changes of this many proxies (the distinct
	// proxies changed after a trim add to it until the next); a caller
	// further behind gets a Reset. Default MaxList: a caller that missed
	// the changes of more proxies than that is answered Reset anyway, and
	// one that missed fewer finds them all in a log that long.
	MaxChangeLog int
	// OnGeneration is called (once per change, from the operation that saw
	// it) when Redis turned out to be on a new generation.
	OnGeneration func(old, new string)
	Logger       *slog.Logger
}

// Pool defaults.
const (
	DefaultHardExpiryGrace = time.Minute
	DefaultIdempotencyTTL  = 10 * time.Minute
	DefaultMaxExamined     = 100_000
	DefaultMaxList         = 100_000
	sweepBatch             = 10_000
)

func (o *Options) defaults() error {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if strings.ContainsAny(o.Namespace, "{}") {
		return fmt.Errorf("redis namespace %q must not contain braces", o.Namespace)
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = DefaultOpTimeout
	}
	if o.HardExpiryGrace <= 0 {
		o.HardExpiryGrace = DefaultHardExpiryGrace
	}
	if o.IdempotencyTTL <= 0 {
		o.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if o.MaxExamined <= 0 {
		o.MaxExamined = DefaultMaxExamined
	}
	if o.MaxList <= 0 {
		o.MaxList = DefaultMaxList
	}
	if o.MaxChangeLog <= 0 {
		o.MaxChangeLog = o.MaxList
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// NewClient builds the go-redis client of a storage.redis section: the URL
// (redis:// or rediss://), the password secret (which wins over one in the
// URL), TLS, and bounded timeouts. Commands are never retried by the
// client: a retried extraction whose reply was lost would consume proxies
// twice.
func NewClient(c config.Redis) (*redis.Client, error) {
	if c.URL == "" {
		return nil, errors.New("redis: storage.redis.url is empty")
	}
	o, err := redis.ParseURL(c.URL)
	if err != nil {
		// The parse error may echo the URL, password included.
		return nil, errors.New("redis: storage.redis.url is not a valid redis:// or rediss:// URL")
	}
	if v := c.Password.Value(); v != "" {
		o.Password = v
	}
	if c.TLS.Enabled || o.TLSConfig != nil {
		host := o.Addr
		if h, _, ok := strings.Cut(o.Addr, ":"); ok {
			host = h
		}
		if o.TLSConfig, err = c.TLS.ClientConfig(host); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
	}
	o.DialTimeout = DefaultDialTimeout
	o.ReadTimeout = DefaultIOTimeout
	o.WriteTimeout = DefaultIOTimeout
	o.PoolTimeout = DefaultOpTimeout
	o.PoolSize = DefaultPoolSize
	// No idle connections kept warm: they would redial an unreachable
	// server in the background.
	o.MinIdleConns = 0
	o.DialerRetries = 2
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	return redis.NewClient(o), nil
}

// clientLog routes go-redis's own messages (a failed dial, a bad pooled
// connection) to slog at debug level: during an outage they repeat on
// every attempt, and the store's errors already carry the cause.
type clientLog struct{ log *slog.Logger }

func (l clientLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// layout versions the key layout (keys, index members, hash fields) and
// is part of every key: a process of another layout works on other keys —
// a pool of its own, refilled from the providers — instead of misreading
// these. Bumped on every layout change; 2 added the free indexes per
// upstream and region, carrier and protocol; 3 the change log (a process
// of layout 2 would change proxies without recording it).
const layout = "3"

// core is what the Pool and the Coordinator share: the client, the key
// prefix and the generation this process believes in.
type core struct {
	rdb     redis.UniversalClient
	k       string // "{namespace}:<layout>:"
	opts    Options
	gen     atomic.Pointer[string]
	changes atomic.Uint64
	owns    bool // Close closes rdb
}

func newCore(ctx context.Context, rdb redis.UniversalClient, o Options) (*core, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	c := &core{rdb: rdb, k: "{" + o.Namespace + "}:" + layout + ":", opts: o}
	ctx, cancel := context.WithTimeout(ctx, o.OpTimeout)
	defer cancel()
	g, err := c.ensureGeneration(ctx)
	if err != nil {
		return nil, unavailable("open redis activity store", err)
	}
	c.gen.Store(&g)
	return c, nil
}

func unavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
}

// ensureGeneration returns the server's generation, creating one when the
// key is missing: a fresh server, or one that lost its state.
func (c *core) ensureGeneration(ctx context.Context) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	fresh := hex.EncodeToString(b[:])
	if err := c.rdb.SetNX(ctx, c.k+"gen", fresh, 0).Err(); err != nil {
		return "", err
	}
	return c.rdb.Get(ctx, c.k+"gen").Result()
}

// Generation is the Redis generation this process currently uses.
func (c *core) Generation() string { return *c.gen.Load() }

// GenerationChanges counts the generation changes this process saw.
func (c *core) GenerationChanges() uint64 { return c.changes.Load() }

// adopt switches to the server's generation after a script reported
// another one (seen == "" when the key is gone) and returns the error the
// operation reports.
func (c *core) adopt(ctx context.Context, what, old, seen string) error {
	next := seen
	if next == "" {
		g, err := c.ensureGeneration(ctx)
		if err != nil {
			return unavailable(what, fmt.Errorf("redis lost its state; creating a new generation: %w", err))
		}
		next = g
	}
	if c.swapIf(old, next) {
		c.changes.Add(1)
		c.opts.Logger.Warn("redis generation changed: state lost, everything of the old generation is void",
			"component", "redisstore", "old", old, "new", next)
		if c.opts.OnGeneration != nil {
			c.opts.OnGeneration(old, next)
		}
	}
	return fmt.Errorf("%s: %w", what, &GenerationError{Old: old, New: next})
}

// swapIf replaces the generation when it still is old (CompareAndSwap on
// the pointer compares addresses, not strings).
func (c *core) swapIf(old, next string) bool {
	for {
		p := c.gen.Load()
		if *p != old {
			return false
		}
		if c.gen.CompareAndSwap(p, &next) {
			return true
		}
	}
}

// run executes a script under the operation timeout with the prefix and
// gen as ARGV[1..2], translating transport failures and generation
// mismatches. The reply is the script's array; reply[0] is its status.
func (c *core) run(parent context.Context, s *redis.Script, what, gen string, args ...any) ([]any, error) {
	if err := parent.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ctx, cancel := context.WithTimeout(parent, c.opts.OpTimeout)
	defer cancel()
	argv := make([]any, 0, len(args)+2)
	argv = append(argv, c.k, gen)
	argv = append(argv, args...)
	res, err := s.Run(ctx, c.rdb, []string{c.k + "gen"}, argv...).Slice()
	if err != nil {
		if parent.Err() != nil {
			// The caller gave up; that says nothing about Redis.
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return nil, unavailable(what, err)
	}
	if len(res) == 0 {
		return nil, unavailable(what, errors.New("empty script reply"))
	}
	if st, _ := res[0].(string); st == "GEN" {
		seen, _ := res[1].(string)
		return nil, c.adopt(ctx, what, gen, seen)
	}
	return res, nil
}

func status(res []any) string { s, _ := res[0].(string); return s }

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

func micros(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

func fromMicros(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMicro(n).UTC()
}
