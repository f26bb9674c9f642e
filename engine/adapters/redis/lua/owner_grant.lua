-- ARGV: 3 worker, 4 ttl ms. A new lease takes a new epoch from a counter
-- that only grows within a generation; a live lease is not replaced.
local bad = genmismatch(); if bad then return bad end
local now = nowus()
local k = K .. 'ol:' .. ARGV[3]
local l = redis.call('HMGET', k, 'epoch', 'exp')
if l[1] and num(l[2]) > now then return {'HELD', tonumber(l[1]), l[2]} end
local epoch = redis.call('INCR', K .. 'olepoch')
local exp = now + tonumber(ARGV[4]) * 1000
redis.call('HSET', k, 'epoch', epoch, 'exp', s(exp))
redis.call('PEXPIREAT', k, s(math.floor(exp / 1000) + 1))
return {'OK', epoch, s(exp)}
