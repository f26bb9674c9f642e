-- ARGV: 3 id, 4 from, 5 to, 6 checkedAt µs, 7 success 0|1, 8 latency ns,
-- 9 consecutive fails.
local bad = genmismatch(); if bad then return bad end
local id, from, to = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local pk = pkey(id)
local e = redis.call('HMGET', pk, unpack(CORE))
if not e[1] then return {'NF'} end
if tonumber(e[1]) ~= from then return {'CF', tonumber(e[1])} end
redis.call('HSET', pk, 'lc', ARGV[6], 'cf', ARGV[9])
if ARGV[7] == '1' then redis.call('HSET', pk, 'ls', ARGV[6], 'lat', ARGV[8]) end
if from ~= to then move(id, e, to) else changed(id) end
return {'OK'}
