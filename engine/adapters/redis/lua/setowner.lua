-- ARGV: 3 owner ('' clears), 4 lease worker ('' = unfenced), 5 lease
-- epoch, 6.. ids. All or nothing: every id is checked before any changes.
local bad = genmismatch(); if bad then return bad end
local owner, lw, lepoch = ARGV[3], ARGV[4], ARGV[5]
if lw ~= '' then
  local l = redis.call('HMGET', K .. 'ol:' .. lw, 'epoch', 'exp')
  if l[1] ~= lepoch or num(l[2]) <= nowus() then return {'LEASE'} end
end
for i = 6, #ARGV do
  local e = redis.call('HMGET', pkey(ARGV[i]), 'st', 'ow')
  if not e[1] then return {'NF', ARGV[i]} end
  if owner ~= '' then
    if tonumber(e[1]) ~= AVAILABLE then return {'CF', ARGV[i], tonumber(e[1])} end
    if e[2] ~= '' and e[2] ~= owner then return {'OWNED', ARGV[i]} end
  end
end
for i = 6, #ARGV do
  local id = ARGV[i]
  local e = redis.call('HMGET', pkey(id), 'st', 'up', 'm', 'ow', 'uu', 'sc', 'rg', 'cr')
  if e[4] ~= owner then
    if tonumber(e[1]) == AVAILABLE then
      if owner == '' then
        freeAdd(e[2], e[3], e[5], asufs(e[6], e[7], e[8]))
      elseif e[4] == '' then
        freeDel(e[2], e[3], asufs(e[6], e[7], e[8]))
      end
    end
    if e[4] ~= '' then redis.call('SREM', owkey(e[4]), id) end
    if owner ~= '' then redis.call('SADD', owkey(owner), id) end
    redis.call('HSET', pkey(id), 'ow', owner)
    changed(id)
  end
end
return {'OK'}
