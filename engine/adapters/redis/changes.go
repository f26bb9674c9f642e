package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Change log bounds.
const (
	// changeTrimBatch bounds the log entries one Changes or Sweep trims,
	// and changeIDBatch the ids one Changes answers (more changed: Reset),
	// so that no one script keeps Redis — single-threaded — from every
	// other client for more than a few milliseconds.
	changeTrimBatch = 25_000
	changeIDBatch   = 10_000
	// changeDropBatch bounds the ids of expired entries one Changes drops
	// from the state indexes (and records).
	changeDropBatch = 10_000
	// changeReadBatch is the proxies read per pipelined round trip.
	changeReadBatch = 1000
	// maxExactVersion: versions are sorted-set scores, exact up to 2^53.
	maxExactVersion = 1 << 53
)

// feedState maps the change log's counter, which restarts at 0 with every
// Redis generation, to versions that never repeat within the Pool: the
// versions of a generation are base + counter, and a generation the feed
// has not answered for yet gets a base above every version handed out.
// A version of an earlier generation is then below the base and answers
// Reset.
type feedState struct {
	mu   sync.Mutex
	gen  string
	base uint64
	next uint64 // above every version handed out; 0 until the first
}

func (f *feedState) baseFor(gen string) uint64 {
	if gen != f.gen || f.next == 0 {
		f.gen, f.base = gen, max(f.next, 1)
	}
	return f.base
}

// Changes implements activitypool.ChangeFeed. One script drops (recording
// them) the ids of entries Redis expired, trims the log to MaxChangeLog,
// and reads the version with the ids changed after since; the proxies are
// then read in pipelined batches of changeReadBatch. A change made after
// the script has a later version, so it is reported by the next call, if
// not already by this one (a proxy read after it changed again is reported
// twice, its current state both times).
//
// It answers Reset for since 0, a version after the current one, one of
// an earlier Redis generation (state lost), one older than the log's
// floor, when more than changeIDBatch (or MaxList) proxies changed since
// (a listing is then the cheaper read), and when more than
// changeDropBatch expired entries were found (the rest are recorded by
// the next call; a listing skips them).
// Versions belong to the Pool value that answered (another process's Pool
// numbers them differently); calls on one Pool are serialised.
//
// A Redis rolled back without losing its generation (a failover to a
// lagging replica, an older snapshot) numbers new changes with versions it
// had already used: a caller whose since is above the rolled-back counter
// gets Reset, but one whose since the writes overtake before it reads
// again can miss what the rollback undid. The publisher's mirror lists
// the pool every few minutes whatever the feed says, which bounds that.
func (p *Pool) Changes(ctx context.Context, since uint64, states []proxy.State) (activitypool.Changes, error) {
	const what = "read pool changes"
	p.feed.mu.Lock()
	defer p.feed.mu.Unlock()
	var (
		r    []any
		base uint64
		err  error
	)
	for attempt := 0; ; attempt++ {
		gen := p.Generation()
		base = p.feed.baseFor(gen)
		raw := "-1"
		if since >= base && since-base < maxExactVersion {
			raw = strconv.FormatUint(since-base, 10)
		}
		r, err = p.run(ctx, scriptChanges, what, gen, raw, p.opts.MaxChangeLog, changeTrimBatch, min(p.opts.MaxList, changeIDBatch), changeDropBatch)
		if err == nil {
			break
		}
		// Redis lost its state: the store adopted the new generation,
		// whose versions start above every one handed out, so the retry
		// answers Reset.
		if attempt == 0 && errors.Is(err, ErrGenerationChanged) {
			continue
		}
		return activitypool.Changes{}, err
	}
	v, perr := strconv.ParseUint(toStr(r[1]), 10, 64)
	if perr != nil {
		return activitypool.Changes{}, fmt.Errorf("%s: version %v: %w", what, r[1], perr)
	}
	out := activitypool.Changes{Version: base + v}
	p.feed.next = max(p.feed.next, out.Version+1)
	if status(r) == "RESET" {
		out.Reset = true
		return out, nil
	}
	if status(r) != "OK" {
		return activitypool.Changes{}, fmt.Errorf("%s: unexpected reply %v", what, r)
	}
	ids, _ := r[2].([]any)
	if err := p.readChanges(ctx, ids, states, &out); err != nil {
		return activitypool.Changes{}, err
	}
	return out, nil
}

// readChanges reads the proxies ids name into out: Changed when in one of
// states (any when none), Gone when deleted or in another state.
func (p *Pool) readChanges(ctx context.Context, ids []any, states []proxy.State, out *activitypool.Changes) error {
	const what = "read changed proxies"
	if len(ids) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.OpTimeout)
	defer cancel()
	for chunk := range slices.Chunk(ids, changeReadBatch) {
		pipe := p.rdb.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(chunk))
		for i, id := range chunk {
			cmds[i] = pipe.HGetAll(cctx, p.pkey(proxy.ID(toStr(id))))
		}
		if _, err := pipe.Exec(cctx); err != nil {
			return p.readErr(ctx, what, err)
		}
		for i, c := range cmds {
			m := c.Val()
			if len(m) == 0 {
				out.Gone = append(out.Gone, proxy.ID(toStr(chunk[i])))
				continue
			}
			px, err := decodeMap(m)
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if len(states) > 0 && !slices.Contains(states, px.State) {
				out.Gone = append(out.Gone, proxy.ID(toStr(chunk[i])))
				continue
			}
			out.Changed = append(out.Changed, px)
		}
	}
	slices.SortFunc(out.Changed, func(a, b proxy.Proxy) int { return cmp.Compare(a.ID, b.ID) })
	slices.Sort(out.Gone)
	return nil
}

var _ activitypool.ChangeFeed = (*Pool)(nil)
