package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// bulkBody inserts proxies straight into AVAILABLE with the same helpers
// the real scripts use, for loading benchmark pools of a million entries
// without two million lifecycle scripts.
const bulkBody = `
local up, n, grace = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local now = nowus()
for i = 0, n - 1 do
  local b = 5 + i * 14
  local id = ARGV[b + 1]
  local seq = redis.call('INCR', K .. 'seq')
  local m = member(seq, tonumber(ARGV[b + 11]), id)
  local dl = math.floor(tonumber(ARGV[b + 9]) / 1000) + grace
  redis.call('HSET', pkey(id), 'id', id, 'sc', ARGV[b + 2], 'h', ARGV[b + 3], 'po', ARGV[b + 4], 'un', ARGV[b + 5],
    'cv', ARGV[b + 6], 'pw', ARGV[b + 7], 'ca', s(now), 'ex', ARGV[b + 9], 'uu', ARGV[b + 10], 'mc', ARGV[b + 11],
    'rg', ARGV[b + 12], 'cr', ARGV[b + 13], 'tg', ARGV[b + 14], 'up', up, 'st', AVAILABLE, 'm', m, 'dl', s(dl),
    'ow', '', 'lc', s(now), 'ls', s(now), 'lat', '0', 'cf', '0', 'xa', '', 'xc', '')
  redis.call('PEXPIREAT', pkey(id), s(dl))
  redis.call('ZADD', skey(up, AVAILABLE), s(dl), id)
  addAvail(up, m, ARGV[b + 10], '', asufs(ARGV[b + 2], ARGV[b + 12], ARGV[b + 13]))
end
redis.call('SADD', K .. 'ups', up)
return {'OK'}
`

var scriptBulk = func() *redis.Script {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(lib) + bulkBody)
}()

// BenchRegions are the regions BulkLoadAvailable deals out in turn.
var BenchRegions = []string{"eu", "us", "ap", "sa"}

// BulkLoadAvailable loads n AVAILABLE proxies named prefix-i under up,
// pipelining scripts of chunk proxies, usable for an hour or more (spread
// so the index has distinct scores), their regions dealt from BenchRegions
// so that every second of UsableUntil holds each region alike.
func BulkLoadAvailable(ctx context.Context, p *Pool, up, prefix string, n int) error {
	const chunk, depth = 500, 8
	now := time.Now()
	// Loading a million entries on a busy machine outlasts the store's
	// deliberately short read timeout: a private client waits longer.
	o := *p.rdb.(*redis.Client).Options()
	o.ReadTimeout, o.WriteTimeout = time.Minute, time.Minute
	rdb := redis.NewClient(&o)
	defer rdb.Close()
	if err := scriptBulk.Load(ctx, rdb).Err(); err != nil {
		return err
	}
	pipe := rdb.Pipeline()
	queued := 0
	for start := 0; start < n; start += chunk {
		args := []any{p.k, p.Generation(), up, 0, p.opts.HardExpiryGrace.Milliseconds()}
		cnt := 0
		for i := start; i < min(start+chunk, n); i++ {
			px := proxy.Proxy{
				Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: fmt.Sprintf("%s-%d.example", prefix, i), Port: 8080, Username: "u"},
				Password:       "pw",
				ExpiresAt:      now.Add(2*time.Hour + time.Duration(i%3600)*time.Second),
				UsableUntil:    now.Add(time.Hour + time.Duration(i%3600)*time.Second),
				MaxConcurrency: 4,
				Region:         BenchRegions[(i+i/3600)%len(BenchRegions)],
			}
			a, err := admitArgs(&px, proxy.MakeID(px.Key))
			if err != nil {
				return err
			}
			args = append(args, a...)
			cnt++
		}
		args[3] = strconv.Itoa(cnt)
		scriptBulk.EvalSha(ctx, pipe, []string{p.k + "gen"}, args...)
		if queued++; queued == depth {
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
			queued = 0
		}
	}
	if queued > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// KeyPrefix is the prefix of every key of p: "{namespace}:<layout>:".
func KeyPrefix(p *Pool) string { return p.k }

// FreeIndexes reads the free indexes of upstream up: its main one and, by
// key suffix (":r:eu"), every attribute index its fx set lists. Members map
// to scores.
func FreeIndexes(ctx context.Context, p *Pool, up string) (main map[string]float64, attr map[string]map[string]float64, err error) {
	read := func(key string) (map[string]float64, error) {
		zs, err := p.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		out := make(map[string]float64, len(zs))
		for _, z := range zs {
			out[z.Member.(string)] = z.Score
		}
		return out, err
	}
	fr := p.k + "u:" + up + ":fr"
	if main, err = read(fr); err != nil {
		return nil, nil, err
	}
	keys, err := p.rdb.SMembers(ctx, p.k+"u:"+up+":fx").Result()
	if err != nil {
		return nil, nil, err
	}
	attr = make(map[string]map[string]float64, len(keys))
	for _, k := range keys {
		if attr[k[len(fr):]], err = read(k); err != nil {
			return nil, nil, err
		}
	}
	return main, attr, nil
}

// MemberID is the proxy ID an index member ends with (lua/lib.lua member).
func MemberID(m string) proxy.ID { return proxy.ID(m[24:]) }
