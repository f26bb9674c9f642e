package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/adapters/storetest"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/testenv"
)

var nsSeq atomic.Int64

// namespace gives every test its own keyspace on a shared server.
func namespace(t testing.TB) string {
	return fmt.Sprintf("t%d-%s", nsSeq.Add(1), t.Name())
}

func client(t testing.TB, srv *testenv.Redis) *redis.Client {
	t.Helper()
	rdb, err := redisstore.NewClient(config.Redis{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func newPool(t testing.TB, rdb redis.UniversalClient, o redisstore.Options) *redisstore.Pool {
	t.Helper()
	if o.Namespace == "" {
		o.Namespace = namespace(t)
	}
	p, err := redisstore.New(context.Background(), rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPoolContract(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	storetest.RunPoolContract(t, func(t *testing.T) activitypool.Pool {
		return newPool(t, rdb, redisstore.Options{})
	})
}
