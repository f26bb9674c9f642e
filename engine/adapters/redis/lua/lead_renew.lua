-- ARGV: 3 upstream, 4 holder, 5 epoch, 6 ttl ms ('0' releases, '-1' only
-- checks the fence).
local bad = genmismatch(); if bad then return bad end
local now = nowus()
local k = K .. 'lead:' .. ARGV[3]
local cur = redis.call('HMGET', k, 'holder', 'epoch', 'exp')
if cur[1] ~= ARGV[4] or cur[2] ~= ARGV[5] or num(cur[3]) <= now then return {'LOST'} end
if ARGV[6] == '-1' then return {'OK', cur[3]} end
if ARGV[6] == '0' then
  redis.call('DEL', k)
  return {'OK', s(now)}
end
local exp = now + tonumber(ARGV[6]) * 1000
redis.call('HSET', k, 'exp', s(exp))
redis.call('PEXPIREAT', k, s(math.floor(exp / 1000) + 1))
return {'OK', s(exp)}
