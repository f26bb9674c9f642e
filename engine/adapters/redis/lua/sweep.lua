-- ARGV: 3 max entries examined per index, 4 change log length, 5 max
-- change log entries trimmed. Housekeeping that key TTLs cannot do: drop
-- ids of server-expired entries from the state indexes (recording the
-- changes), delete REMOVED entries (as the embedded Sweep does), drop
-- index members whose entry expired server-side (correcting the slot
-- sums), forget emptied upstreams and trim the change log. Returns
-- removed, ghosts dropped (of the state and AVAILABLE indexes).
local bad = genmismatch(); if bad then return bad end
local limit = tonumber(ARGV[3])
local now = nowus()
local nowms = s(math.floor(now / 1000))
local removed, ghosts = 0, 0
for _, up in ipairs(redis.call('SMEMBERS', K .. 'ups')) do
  local live = 0
  for st = 1, 9 do
    ghosts = ghosts + dropExpired(skey(up, st), nowms, limit)
  end
  for _, id in ipairs(redis.call('ZRANGE', skey(up, REMOVED), 0, limit - 1)) do
    local e = redis.call('HMGET', pkey(id), 'st', 'up', 'm', 'ow')
    if e[1] then
      delEntry(id, tonumber(e[1]), e[2], e[3], e[4])
    else
      redis.call('ZREM', skey(up, REMOVED), id)
      changed(id)
    end
    removed = removed + 1
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', avkey(up), '-inf', s(now), 'LIMIT', 0, limit)) do
    if redis.call('HGET', pkey(idOf(m)), 'm') ~= m then
      -- Its attributes went with the key: the attribute indexes are
      -- swept below, each on its own.
      delAvail(up, m, {})
      ghosts = ghosts + 1
    end
  end
  local fx = fxkey(up)
  for _, k in ipairs(redis.call('SMEMBERS', fx)) do
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', k, '-inf', s(now), 'LIMIT', 0, limit)) do
      if redis.call('HGET', pkey(idOf(m)), 'm') ~= m then redis.call('ZREM', k, m) end
    end
    if redis.call('EXISTS', k) == 0 then redis.call('SREM', fx, k) end
  end
  for st = 1, 9 do live = live + redis.call('ZCARD', skey(up, st)) end
  if live == 0 and redis.call('ZCARD', avkey(up)) == 0 then
    redis.call('SREM', K .. 'ups', up)
    for _, k in ipairs(redis.call('SMEMBERS', fx)) do redis.call('DEL', k) end
    redis.call('DEL', sskey(up), frkey(up), fx)
  end
end
trimLog(tonumber(ARGV[4]), tonumber(ARGV[5]))
return {'OK', removed, ghosts}
