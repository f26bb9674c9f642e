package distribution_test

import (
	"context"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/distribution/distributiontest"
)

// TestDeltaPublishEqualsFullRebuild: over the embedded pool's change feed,
// the publisher publishes exactly what one listing the pool every round
// does (distributiontest.FeedEqualsListing).
func TestDeltaPublishEqualsFullRebuild(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	// A small change log, so that long rounds outrun it and the feed
	// answers Reset.
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return now }, MaxChangeLog: 32})
	distributiontest.FeedEqualsListing(t, distributiontest.Case{
		Pool: pool, Now: &now,
		Sweep: func(_ context.Context, now time.Time) error { pool.Sweep(now); return nil },
		Keys:  150, Rounds: 400,
		MinListed: 5, MinFollowed: 200, MinPublished: 400 * 10,
	})
}
