-- ARGV: 3 upstream. Returns total, pending, in flight, expired permits.
local bad = genmismatch(); if bad then return bad end
local up = ARGV[3]
local l = redis.call('HMGET', K .. 'f:' .. up .. ':lg', 'total', 'pending', 'expired')
return {'OK', num(l[1]), num(l[2]), redis.call('ZCARD', K .. 'f:' .. up .. ':pm'), num(l[3])}
