-- ARGV: 3 upstream, 4 permit id, 5 actual count ('' = unknown: book the
-- expected amount). Idempotent, and independent of who leads now: a permit
-- settles once, whoever holds it; an expired permit was already booked.
local bad = genmismatch(); if bad then return bad end
local up, id = ARGV[3], ARGV[4]
local pm, px, lg = K .. 'f:' .. up .. ':pm', K .. 'f:' .. up .. ':px', K .. 'f:' .. up .. ':lg'
local e = redis.call('HGET', px, id)
if not e then return {'OK', 0, 0} end
local booked = tonumber(e)
if ARGV[5] ~= '' then booked = tonumber(ARGV[5]) end
redis.call('HINCRBY', lg, 'pending', -tonumber(e))
redis.call('HINCRBY', lg, 'total', booked)
redis.call('HDEL', px, id)
redis.call('ZREM', pm, id)
return {'OK', 1, booked}
