package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	pgstore "github.com/proxypool/proxypool/engine/adapters/postgres"
	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/version"
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
	// coord is the cluster coordination (fetch leadership and permits,
	// client rate limits, heartbeats); nil on embedded storage, where this
	// process decides alone.
	coord *redisstore.Coordinator
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
		pool: pool, mgmt: mgmt, coord: pool.Coordinator(),
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

// coordinator is the controller's view of st.coord: nil on embedded
// storage (a nil *Coordinator must not become a non-nil interface).
func (st *stores) coordinator() controller.Coordinator {
	if st.coord == nil {
		return nil
	}
	return st.coord
}

// instanceID names this process incarnation in leader leases and worker
// heartbeats: host, pid and a random suffix, so a restarted process never
// reuses a predecessor's name.
func instanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "proxypool"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// heartbeatLives is how many intervals a heartbeat keeps a worker live.
const heartbeatLives = 3

// heartbeat records every interval that this process's gateway worker is
// alive (seed 000 §12.2), with its version and applied snapshot version.
// An outage is logged once, and its end once.
func heartbeat(ctx context.Context, c *redisstore.Coordinator, id string, every time.Duration, snapshot func() uint64, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		hctx, cancel := context.WithTimeout(ctx, every)
		err := c.Heartbeat(hctx, id, heartbeatLives*every, map[string]string{
			"version": version.Version, "snapshotVersion": strconv.FormatUint(snapshot(), 10),
		})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			log.Warn("worker heartbeat failed; retrying every interval", "worker", id, "err", err)
			failing = true
		case err == nil && failing:
			log.Info("worker heartbeat recorded again", "worker", id)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

var _ controller.Coordinator = (*redisstore.Coordinator)(nil)
