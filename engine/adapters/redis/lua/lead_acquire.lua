-- ARGV: 3 upstream, 4 holder, 5 ttl ms. Every new term takes a new epoch
-- from a counter that only grows within the generation.
local bad = genmismatch(); if bad then return bad end
local now = nowus()
local k = K .. 'lead:' .. ARGV[3]
local cur = redis.call('HMGET', k, 'holder', 'epoch', 'exp')
if cur[1] and num(cur[3]) > now then return {'HELD', cur[1], tonumber(cur[2])} end
local epoch = redis.call('INCR', K .. 'lepoch:' .. ARGV[3])
local exp = now + tonumber(ARGV[5]) * 1000
redis.call('DEL', k)
redis.call('HSET', k, 'holder', ARGV[4], 'epoch', epoch, 'exp', s(exp))
redis.call('PEXPIREAT', k, s(math.floor(exp / 1000) + 1))
return {'OK', epoch, s(exp)}
