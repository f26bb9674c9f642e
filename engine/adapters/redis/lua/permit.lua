-- ARGV: 3 upstream, 4 holder, 5 epoch, 6 requestInterval µs,
-- 7 maxInFlight (0 = none), 8 maxTotal (0 = none), 9 expected, 10 ttl ms.
-- One atomic decision under the leader fence: book expired permits at
-- their expected amount, then requestInterval, maxInFlight and the maxTotal
-- ledger (settled total + pending expected + this call's expected).
local bad = genmismatch(); if bad then return bad end
local up = ARGV[3]
local now = nowus()
local nowms = math.floor(now / 1000)
local cur = redis.call('HMGET', K .. 'lead:' .. up, 'holder', 'epoch', 'exp')
if cur[1] ~= ARGV[4] or cur[2] ~= ARGV[5] or num(cur[3]) <= now then return {'LOST'} end
local interval, maxIn, maxTotal, expected = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local pm, px, lg = K .. 'f:' .. up .. ':pm', K .. 'f:' .. up .. ':px', K .. 'f:' .. up .. ':lg'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', pm, '-inf', s(nowms))) do
  local e = num(redis.call('HGET', px, id))
  redis.call('HINCRBY', lg, 'pending', -e)
  redis.call('HINCRBY', lg, 'total', e)
  redis.call('HINCRBY', lg, 'expired', 1)
  redis.call('HDEL', px, id)
  redis.call('ZREM', pm, id)
end
local nk = K .. 'f:' .. up .. ':next'
local nxt = num(redis.call('GET', nk))
if now < nxt then return {'WAIT', s(nxt - now)} end
local inflight = redis.call('ZCARD', pm)
if maxIn > 0 and inflight >= maxIn then return {'FULL', inflight} end
local l = redis.call('HMGET', lg, 'total', 'pending')
local total, pending = num(l[1]), num(l[2])
if maxTotal > 0 and total + pending + expected > maxTotal then return {'BUDGET', total, pending} end
local id = redis.call('INCR', K .. 'pseq')
local exp = nowms + tonumber(ARGV[10])
redis.call('ZADD', pm, s(exp), id)
redis.call('HSET', px, id, expected)
redis.call('HINCRBY', lg, 'pending', expected)
if interval > 0 then redis.call('SET', nk, s(now + interval), 'PX', s(math.ceil(interval / 1000) + 1)) end
return {'OK', id, s(exp)}
