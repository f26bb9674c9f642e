-- ARGV: 3 worker, 4 epoch, 5 ttl ms ('0' with release = delete).
local bad = genmismatch(); if bad then return bad end
local now = nowus()
local k = K .. 'ol:' .. ARGV[3]
local l = redis.call('HMGET', k, 'epoch', 'exp')
if l[1] ~= ARGV[4] or num(l[2]) <= now then return {'LOST'} end
if ARGV[5] == '0' then
  redis.call('DEL', k)
  return {'OK', tonumber(l[1]), s(now)}
end
local exp = now + tonumber(ARGV[5]) * 1000
redis.call('HSET', k, 'exp', s(exp))
redis.call('PEXPIREAT', k, s(math.floor(exp / 1000) + 1))
return {'OK', tonumber(l[1]), s(exp)}
