package testenv

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func newRedisClient(t *testing.T, r *Redis) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(r.URL())
	if err != nil {
		t.Fatalf("parsing %s: %v", r.URL(), err)
	}
	opts.DialTimeout = time.Second
	opts.MaxRetries = -1 // we want to see failures, not have them retried away
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRedisStopStartLosesData(t *testing.T) {
	r := StartRedis(t)
	ctx := context.Background()

	c := newRedisClient(t, r)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	r.Stop()
	if err := newRedisClient(t, r).Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded while stopped")
	}
	ln, err := net.Listen("tcp", r.Addr())
	if err != nil {
		t.Fatalf("port not free after Stop: %v", err)
	}
	ln.Close()

	r.Start()
	c = newRedisClient(t, r)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after restart: err=%v, want redis.Nil (data lost)", err)
	}

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	r.Restart()
	if err := newRedisClient(t, r).Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart: err=%v, want redis.Nil", err)
	}
}

func TestRedisExternalRefusesRestart(t *testing.T) {
	t.Setenv(RedisURLEnv, "redis://127.0.0.1:1/0")
	var r *Redis
	f := runFake(t, func(tb testing.TB) {
		r = StartRedis(tb)
		r.Restart()
	})
	if r == nil || r.URL() != "redis://127.0.0.1:1/0" || r.Addr() != "127.0.0.1:1" {
		t.Fatalf("external redis not used: %+v", r)
	}
	if f.outcome != "skip" || !strings.Contains(f.msg, "unsupported") {
		t.Fatalf("got %s %q, want skip saying restart is unsupported", f.outcome, f.msg)
	}
}

func TestRedisMissingBinary(t *testing.T) {
	t.Setenv(RedisURLEnv, "")
	t.Setenv("PATH", t.TempDir())
	for ci, want := range map[string]string{"true": "fatal", "": "skip"} {
		t.Setenv("CI", ci)
		f := runFake(t, func(tb testing.TB) { StartRedis(tb) })
		if f.outcome != want || !strings.Contains(f.msg, "redis-server") || !strings.Contains(f.msg, "apt-get install redis-server") {
			t.Errorf("CI=%q: got %s %q, want %s naming redis-server and how to install it", ci, f.outcome, f.msg, want)
		}
	}
}
