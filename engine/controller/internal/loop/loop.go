package loop

import (
	"context"
	"log/slog"
	"time"
)

// RepeatEvery is how often a step that keeps failing is logged again at
// warning level; the failures between go to debug.
const RepeatEvery = time.Minute

// Run calls step at once, then after every tick of every and on every
// value received from wake (nil: ticks only), until ctx is done; it then
// returns without calling step again. Running once before the first tick
// means a freshly started controller does not wait a whole period for its
// first snapshot, sweep or move.
//
// A step error is logged as a warning under what and the loop carries on,
// since the next period retries. A store outage fails every step until it
// ends, so a run of failures is logged when it starts, again every
// RepeatEvery, and once more (info) when a step succeeds again; the
// failures in between are logged at debug. An error
// while ctx is ending is the shutdown cancelling the step, not a fault,
// and is not logged.
func Run(ctx context.Context, every time.Duration, wake <-chan struct{}, log *slog.Logger, what string, step func(context.Context) error) {
	t := time.NewTicker(every)
	defer t.Stop()
	var (
		failures int
		loggedAt time.Time
	)
	for {
		err := step(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			failures++
			level := slog.LevelDebug
			if failures == 1 || time.Since(loggedAt) >= RepeatEvery {
				level, loggedAt = slog.LevelWarn, time.Now()
			}
			log.Log(ctx, level, what, "err", err, "failures", failures)
		case failures > 0:
			log.Info(what+": recovered", "failures", failures)
			failures = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}
