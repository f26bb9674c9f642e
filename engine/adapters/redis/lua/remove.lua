-- ARGV: 3 id.
local bad = genmismatch(); if bad then return bad end
local id = ARGV[3]
local e = redis.call('HMGET', pkey(id), 'st', 'up', 'm', 'ow')
if not e[1] then return {'NF'} end
local st = tonumber(e[1])
if st ~= EXPIRED and st ~= UNHEALTHY and st ~= REMOVED then return {'TE', st} end
delEntry(id, st, e[2], e[3], e[4])
return {'OK'}
