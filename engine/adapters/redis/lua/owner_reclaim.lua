-- ARGV: 3 worker, 4 limit. Clears the ownership of up to limit proxies of
-- a worker whose lease is gone (expired or released): only then may they
-- go to another worker (seed 000 §11). Returns the ids cleared.
local bad = genmismatch(); if bad then return bad end
local w = ARGV[3]
local l = redis.call('HMGET', K .. 'ol:' .. w, 'epoch', 'exp')
if l[1] and num(l[2]) > nowus() then return {'HELD'} end
local cleared = {}
local ids = redis.call('SPOP', owkey(w), tonumber(ARGV[4]))
for _, id in ipairs(ids) do
  local e = redis.call('HMGET', pkey(id), 'st', 'up', 'm', 'ow', 'uu', 'sc', 'rg', 'cr')
  if e[1] and e[4] == w then
    if tonumber(e[1]) == AVAILABLE then freeAdd(e[2], e[3], e[5], asufs(e[6], e[7], e[8])) end
    redis.call('HSET', pkey(id), 'ow', '')
    changed(id)
    cleared[#cleared + 1] = id
  end
end
return {'OK', cleared, redis.call('SCARD', owkey(w))}
