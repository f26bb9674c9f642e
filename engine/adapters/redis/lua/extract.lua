-- ARGV: 3 now µs ('' = server time), 4 count, 5 allOrNothing 0|1,
-- 6 reserveForGateway, 7 client, 8 fingerprint, 9 idempotency key ('' none),
-- 10 idempotency ttl ms, 11 protocol, 12 region, 13 carrier,
-- 14 minRemainingTTL µs, 15 maxHealthCheckAge µs (0 = any),
-- 16 max candidates examined, 17.. distinct upstreams (none = all).
-- Selection, the reserve check, the moves to EXTRACTED and the idempotency
-- record happen in this one script: nothing else runs in between.
local bad = genmismatch(); if bad then return bad end
local now = tonumber(ARGV[3]) or nowus()
local count, aon, reserve = tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[6])
local client, fp, ikey, ittl = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local proto, region, carrier = ARGV[11], ARGV[12], ARGV[13]
local minTTL, maxAge, maxExamined = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local ups = {}
for i = 17, #ARGV do ups[#ups + 1] = ARGV[i] end

local idk = K .. 'idem:' .. ikey
if ikey ~= '' then
  local rec = redis.call('GET', idk)
  if rec then
    local nl = string.find(rec, '\n', 1, true)
    if string.sub(rec, 1, nl - 1) ~= fp then return {'IC'} end
    return {'R', string.sub(rec, nl + 1)}
  end
end

-- One HMGET per candidate reads everything: FIELDS (encoded as the
-- result), then the index member and the key's deadline.
local SEL = {}
for i = 1, NFIELDS do SEL[i] = FIELDS[i] end
SEL[NFIELDS + 1], SEL[NFIELDS + 2] = 'm', 'dl'
local F = {}
for i = 1, NFIELDS do F[FIELDS[i]] = i end

-- Filters.Eligible, field for field (engine/domain/extraction).
local function eligible(f, m)
  if tonumber(f[F.st]) ~= AVAILABLE or f[NFIELDS + 1] ~= m or f[F.ow] ~= '' then return false end
  if not (now < num(f[F.uu])) then return false end
  if proto ~= '' and f[F.sc] ~= proto then return false end
  if region ~= '' and f[F.rg] ~= region then return false end
  if carrier ~= '' and f[F.cr] ~= carrier then return false end
  if num(f[F.ex]) - now < minTTL then return false end
  if maxAge > 0 and now - num(f[F.ls]) > maxAge then return false end
  return true
end

local examined = 0
local floor = '(' .. s(now)
-- walk visits a free index from the most remaining usable time down,
-- stopping at the first entry no longer usable, and collects up to count
-- eligible entries: the cost is the candidates examined, not the pool.
local function walk(key, out)
  local got, off = 0, 0
  local batch = math.min(count + math.max(math.floor(count / 2), 8), 1000)
  while got < count and examined < maxExamined do
    local ms = redis.call('ZREVRANGEBYSCORE', key, '+inf', floor, 'WITHSCORES', 'LIMIT', off, batch)
    if #ms == 0 then break end
    for j = 1, #ms, 2 do
      local m = ms[j]
      examined = examined + 1
      local id = idOf(m)
      local f = redis.call('HMGET', pkey(id), unpack(SEL))
      if f[1] and eligible(f, m) then
        out[#out + 1] = {m = m, id = id, f = f, sc = tonumber(ms[j + 1])}
        got = got + 1
        if got >= count then break end
      end
      if examined >= maxExamined then break end
    end
    off = off + #ms / 2
    if #ms / 2 < batch then break end
  end
end

local picked = {}
if #ups == 0 then
  walk(GFREE, picked)
else
  for _, up in ipairs(ups) do walk(frkey(up), picked) end
  if #ups > 1 then
    -- The best count overall are among each upstream's best count.
    table.sort(picked, function(a, b)
      if a.sc ~= b.sc then return a.sc > b.sc end
      return a.m > b.m
    end)
    for i = #picked, count + 1, -1 do picked[i] = nil end
  end
end

if reserve > 0 then
  local names = ups
  if #names == 0 then names = redis.call('SMEMBERS', K .. 'ups') end
  local usable = 0
  for _, up in ipairs(names) do usable = usable + redis.call('ZCOUNT', avkey(up), floor, '+inf') end
  local room = math.max(usable - reserve, 0)
  for i = #picked, room + 1, -1 do picked[i] = nil end
end

if aon and #picked < count then return {'IN', #picked} end

-- The moves to EXTRACTED, batched per key: one call per index and
-- upstream rather than six per proxy.
local function bulk(cmd, key, args)
  for i = 1, #args, 1000 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
  end
end
local out, byUp, upNames, all = {}, {}, {}, {}
local nows = s(now)
for _, p in ipairs(picked) do
  local f, up = p.f, p.f[F.up]
  redis.call('HSET', pkey(p.id), 'st', EXTRACTED, 'xa', nows, 'xc', client)
  local g = byUp[up]
  if not g then
    g = {ids = {}, ms = {}, moved = {}, slots = 0}
    byUp[up] = g
    upNames[#upNames + 1] = up
  end
  g.ids[#g.ids + 1] = p.id
  g.ms[#g.ms + 1] = p.m
  g.moved[#g.moved + 1] = f[NFIELDS + 2]
  g.moved[#g.moved + 1] = p.id
  g.slots = g.slots + slotsOf(p.m)
  all[#all + 1] = p.m
  f[F.st], f[F.xa], f[F.xc] = tostring(EXTRACTED), nows, client
  encode(out, f)
end
for _, up in ipairs(upNames) do
  local g = byUp[up]
  bulk('ZREM', skey(up, AVAILABLE), g.ids)
  bulk('ZADD', skey(up, EXTRACTED), g.moved)
  -- Every picked member is in the AVAILABLE index: it was AVAILABLE with
  -- this very member.
  bulk('ZREM', avkey(up), g.ms)
  redis.call('DECRBY', sskey(up), g.slots)
  bulk('ZREM', frkey(up), g.ms)
end
if #all > 0 then bulk('ZREM', GFREE, all) end
local payload = table.concat(out)
if ikey ~= '' then redis.call('SET', idk, fp .. '\n' .. payload, 'PX', ittl) end
return {'F', payload}
