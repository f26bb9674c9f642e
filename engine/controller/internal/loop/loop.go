package loop

import (
	"context"
	"log/slog"
	"time"
)

// Run calls step at once, then after every tick of every and on every
// value received from wake (nil: ticks only), until ctx is done; it then
// returns without calling step again. Running once before the first tick
// means a freshly started controller does not wait a whole period for its
// first snapshot, sweep or move. A step error is logged as a warning under
// what and the loop carries on, since the next period retries; an error
// while ctx is ending is the shutdown cancelling the step, not a fault, and
// is not logged.
func Run(ctx context.Context, every time.Duration, wake <-chan struct{}, log *slog.Logger, what string, step func(context.Context) error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := step(ctx); err != nil && ctx.Err() == nil {
			log.Warn(what, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}
