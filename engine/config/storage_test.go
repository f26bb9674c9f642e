package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestClusterStorageSettings(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not checked here"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_FP_KEY", "k3y")
	const base = "listeners: {admin: 127.0.0.1:8082}\n"
	good := base + `storage:
  mode: cluster
  redis:
    url: rediss://cache.internal:6380/2
    password: env:TEST_FP_KEY
    tls: {enabled: true, caFile: ` + ca + `, serverName: cache.internal}
  postgres:
    url: postgres://proxypool@db.internal/proxypool
    migrateOnStart: true
    fingerprintKey: env:TEST_FP_KEY
    tls: {enabled: true}
`
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Storage
	if !s.Redis.TLS.Enabled || s.Redis.TLS.CAFile != ca || s.Redis.TLS.ServerName != "cache.internal" {
		t.Errorf("redis tls = %+v", s.Redis.TLS)
	}
	if !s.Postgres.MigrateOnStart || s.Postgres.FingerprintKey.Value() != "k3y" || !s.Postgres.TLS.Enabled {
		t.Errorf("postgres = %+v", s.Postgres)
	}
	if s.Redis.LeaderTTL != DefaultLeaderTTL || s.Redis.HeartbeatInterval != DefaultHeartbeatInterval {
		t.Errorf("coordination defaults: leaderTTL %s, heartbeatInterval %s", s.Redis.LeaderTTL, s.Redis.HeartbeatInterval)
	}
	if c, err := Parse([]byte(base + "storage: {redis: {leaderTTL: 15s, heartbeatInterval: 2s}}\n")); err != nil ||
		c.Storage.Redis.LeaderTTL != 15*time.Second || c.Storage.Redis.HeartbeatInterval != 2*time.Second {
		t.Errorf("explicit coordination timings: %v", err)
	}

	cases := []struct {
		name, yaml string
		paths      []string
	}{
		{"FingerprintKeyRequiredInCluster", base + "storage: {mode: cluster, redis: {url: redis://r/0}, postgres: {url: postgres://p/db}}\n",
			[]string{"storage.postgres.fingerprintKey"}},
		{"PasswordInURL", base + "storage: {mode: cluster, redis: {url: 'redis://:hunter2@r/0'}, postgres: {url: 'postgres://u:hunter2@p/db', fingerprintKey: env:TEST_FP_KEY}}\n",
			[]string{"storage.redis.url", "storage.postgres.url"}},
		{"WrongScheme", base + "storage: {mode: cluster, redis: {url: http://r/0}, postgres: {url: mysql://p/db, fingerprintKey: env:TEST_FP_KEY}}\n",
			[]string{"storage.redis.url", "storage.postgres.url"}},
		{"CoordinationTimings", base + "storage: {redis: {leaderTTL: 1s, heartbeatInterval: 2m}}\n",
			[]string{"storage.redis.leaderTTL", "storage.redis.heartbeatInterval"}},
		{"TLSFiles", base + "storage: {redis: {tls: {certFile: /nonexistent/c.pem}}, postgres: {tls: {caFile: /nonexistent/ca.pem}}}\n",
			[]string{"storage.redis.tls", "storage.redis.tls.certFile", "storage.postgres.tls.caFile"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("want Errors, got %v", err)
			}
			var got []string
			for _, e := range errs {
				got = append(got, e.Path)
				if slices.Contains([]string{"storage.redis.url", "storage.postgres.url"}, e.Path) && strings.Contains(e.Msg, "hunter2") {
					t.Errorf("error echoes the password: %s", e.Msg)
				}
			}
			for _, p := range tc.paths {
				if !slices.Contains(got, p) {
					t.Errorf("no error at %s in %v", p, errs)
				}
			}
		})
	}
}
