package redisstore_test

import (
	"context"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/controller/distribution/distributiontest"
	"github.com/proxypool/proxypool/testenv"
)

// TestPublisherMirrorOverRedis: the snapshot publisher following the Redis
// pool's change feed publishes, round after round, exactly the snapshots
// of a publisher listing the pool every round
// (distributiontest.FeedEqualsListing).
func TestPublisherMirrorOverRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	// A short change log, so that long rounds outrun it and the feed
	// answers Reset.
	pool := newPool(t, client(t, srv), redisstore.Options{MaxChangeLog: 16, HardExpiryGrace: time.Hour})
	now := time.Now().UTC().Truncate(time.Millisecond)
	distributiontest.FeedEqualsListing(t, distributiontest.Case{
		Pool: pool, Now: &now,
		Sweep: func(ctx context.Context, _ time.Time) error { _, err := pool.Sweep(ctx); return err },
		Keys:  120, Rounds: 200,
		MinListed: 5, MinFollowed: 100, MinPublished: 200 * 5,
	})
}
