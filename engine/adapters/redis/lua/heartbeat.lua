-- ARGV: 3 worker, 4 ttl ms, 5.. info key/value pairs.
local bad = genmismatch(); if bad then return bad end
local nowms = math.floor(nowus() / 1000)
local exp = nowms + tonumber(ARGV[4])
redis.call('ZADD', K .. 'hb', s(exp), ARGV[3])
local hk = K .. 'hb:' .. ARGV[3]
redis.call('DEL', hk)
redis.call('HSET', hk, '_at', s(nowms))
for i = 5, #ARGV, 2 do redis.call('HSET', hk, ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIREAT', hk, s(exp))
return {'OK', s(exp)}
