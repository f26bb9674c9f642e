-- ARGV: 3 id, 4 from, 5 to, 6 at µs (ExtractedAt on a move to EXTRACTED).
local bad = genmismatch(); if bad then return bad end
local id, from, to = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local e = redis.call('HMGET', pkey(id), unpack(CORE))
if not e[1] then return {'NF'} end
if tonumber(e[1]) ~= from then return {'CF', tonumber(e[1])} end
move(id, e, to)
if to == EXTRACTED then redis.call('HSET', pkey(id), 'xa', ARGV[6]) end
return {'OK'}
