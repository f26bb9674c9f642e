package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	pgstore "github.com/proxypool/proxypool/engine/adapters/postgres"
	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/management"
)

// openTimeout bounds connecting to the cluster stores at start.
const openTimeout = 30 * time.Second

// stores are the two stores of storage.mode, with the mode-specific
// housekeeping and revision fingerprint.
type stores struct {
	pool activitypool.Pool
	mgmt management.Store
	// sweep drops what the store keeps past its use: the embedded pool's
	// ended entries, or Redis index members whose keys already expired.
	sweep func(ctx context.Context, now time.Time)
	// fingerprint identifies a configuration revision.
	fingerprint func(*config.Config) string
	close       func()
}

func openStores(cfg *config.Config, log *slog.Logger) (*stores, error) {
	if cfg.Storage.Mode == "cluster" {
		return openCluster(cfg, log)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	mgmt, err := embedded.OpenManagement(cfg.StateDir, embedded.ManagementOptions{})
	if err != nil {
		return nil, err
	}
	pool := embedded.NewPool(embedded.PoolOptions{})
	return &stores{
		pool: pool, mgmt: mgmt,
		sweep:       func(_ context.Context, now time.Time) { pool.Sweep(now) },
		fingerprint: func(c *config.Config) string { return c.Digest },
		close:       func() { mgmt.Close() },
	}, nil
}

// openCluster connects to Redis (activity pool) and PostgreSQL
// (management state). A schema behind the binary is reported as is: the
// operator runs `proxy-controller migrate up` or sets migrateOnStart.
func openCluster(cfg *config.Config, log *slog.Logger) (*stores, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	pool, err := redisstore.OpenWith(ctx, cfg.Storage.Redis, redisstore.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("opening the Redis activity pool: %w", err)
	}
	mgmt, err := pgstore.Open(ctx, cfg.Storage.Postgres)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("opening the PostgreSQL management store: %w", err)
	}
	return &stores{
		pool: pool, mgmt: mgmt,
		sweep: func(ctx context.Context, _ time.Time) {
			if _, err := pool.Sweep(ctx); err != nil {
				log.Warn("sweeping the Redis activity pool", "err", err)
			}
		},
		fingerprint: func(c *config.Config) string {
			fp, err := mgmt.Fingerprint(c)
			if err != nil {
				log.Warn("fingerprinting the configuration", "err", err)
				return ""
			}
			return fp
		},
		close: func() {
			mgmt.Close()
			pool.Close()
		},
	}, nil
}
