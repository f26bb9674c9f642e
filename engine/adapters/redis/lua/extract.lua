-- ARGV: 3 now µs ('' = server time), 4 count, 5 allOrNothing 0|1,
-- 6 reserveForGateway, 7 client, 8 fingerprint, 9 idempotency key ('' none),
-- 10 idempotency ttl ms, 11 protocol, 12 region, 13 carrier,
-- 14 minRemainingTTL µs, 15 maxHealthCheckAge µs (0 = any),
-- 16 max candidates examined, 17.. distinct upstreams (none = all).
-- Selection, the reserve check, the moves to EXTRACTED and the idempotency
-- record happen in this one script: nothing else runs in between.
--
-- Replies {'F', row...}: one row per proxy, its FIELDS in order (the
-- Lua→Redis conversion of the rows is cheap; formatting them into a
-- string in Lua is not, so that only happens for an idempotency record),
-- or {'R', record} replaying one, {'IC'}, {'IN', n}.
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

-- A row is FIELDS in order. Its HMGET reads the index member in the place
-- of the id (which the member ends with) and the key's deadline in the
-- place of xa; xa and xc are this script's to set.
local F = {}
for i = 1, NFIELDS do F[FIELDS[i]] = i end
local ID, DL, XC = F.id, F.xa, F.xc
local ST, OW, UU, EX, SC, RG, CR, LS, UP = F.st, F.ow, F.uu, F.ex, F.sc, F.rg, F.cr, F.ls, F.up
local SEL = {}
for i = 1, NFIELDS - 1 do SEL[i] = FIELDS[i] end
SEL[ID], SEL[DL] = 'm', 'dl'
-- Without a protocol, region or carrier filter nearly every candidate is
-- taken, so one HMGET reads its whole row. With one, most may be
-- rejected: a candidate is checked on the fields the filters and the moves
-- need (CHECK), and only a taken one reads the rest of its row (REST).
local CHECK, REST = {}, {}
if proto == '' and region == '' and carrier == '' then
  for i = 1, NFIELDS - 1 do CHECK[i] = i end
else
  CHECK = {ID, ST, OW, UU, EX, DL, UP, SC, RG, CR, LS}
  local checked = {}
  for _, i in ipairs(CHECK) do checked[i] = true end
  for i = 1, NFIELDS - 1 do
    if not checked[i] then REST[#REST + 1] = i end
  end
end
local function names(list)
  local t = {}
  for j, i in ipairs(list) do t[j] = SEL[i] end
  return t
end
local SELC, SELR = names(CHECK), names(REST)
-- read HMGETs the fields at row positions list into row f (a new row when
-- f is nil).
local function read(id, list, sel, f)
  local v = redis.call('HMGET', pkey(id), unpack(sel))
  if not f and #list == NFIELDS - 1 then return v end
  f = f or {}
  for j = 1, #list do f[list[j]] = v[j] end
  return f
end

-- Filters.Eligible, field for field (engine/domain/extraction).
local function eligible(f, m)
  if tonumber(f[ST]) ~= AVAILABLE or f[ID] ~= m or f[OW] ~= '' then return false end
  if not (now < num(f[UU])) then return false end
  if proto ~= '' and f[SC] ~= proto then return false end
  if region ~= '' and f[RG] ~= region then return false end
  if carrier ~= '' and f[CR] ~= carrier then return false end
  if num(f[EX]) - now < minTTL then return false end
  if maxAge > 0 and now - num(f[LS]) > maxAge then return false end
  return true
end

-- A source walks one free index from the most remaining usable time down
-- to the last entry still usable, a page at a time, so a request costs
-- O(log n) per page plus the candidates examined, not the pool. The first
-- page is a score range; later ones (after filters rejected candidates) go
-- by rank, which the skip list finds in O(log n), where a LIMIT offset
-- into the score range would step over every skipped member again. With
-- several sources the pages carry scores, to merge them in index order.
local floor = '(' .. s(now)
local function source(key, scored)
  return {key = key, scored = scored, ms = {}, i = 1, off = 0, batch = math.min(count, 1000)}
end
local function fetch(src)
  local key, ms = src.key, nil
  if src.off == 0 then
    if src.scored then
      ms = redis.call('ZREVRANGEBYSCORE', key, '+inf', floor, 'WITHSCORES', 'LIMIT', 0, src.batch)
    else
      ms = redis.call('ZREVRANGEBYSCORE', key, '+inf', floor, 'LIMIT', 0, src.batch)
    end
  else
    src.usable = src.usable or redis.call('ZCOUNT', key, floor, '+inf')
    if src.off >= src.usable then return {} end
    local last = math.min(src.off + src.batch, src.usable) - 1
    if src.scored then
      ms = redis.call('ZREVRANGE', key, src.off, last, 'WITHSCORES')
    else
      ms = redis.call('ZREVRANGE', key, src.off, last)
    end
  end
  local n = src.scored and #ms / 2 or #ms
  src.done = n < src.batch
  src.off = src.off + n
  src.batch = math.min(src.batch * 2, 1000)
  return ms
end
-- head is the source's next member and its score (0 unscored), or nil.
local function head(src)
  if src.i > #src.ms then
    if src.done then return nil end
    src.ms, src.i = fetch(src), 1
    if #src.ms == 0 then src.done = true; return nil end
  end
  if src.scored then return src.ms[src.i], tonumber(src.ms[src.i + 1]) end
  return src.ms[src.i], 0
end

-- With a protocol, region or carrier filter the walk goes over the
-- attribute free index that applies with the fewest members (summed over
-- the upstreams asked, or all), so what it examines are entries that
-- match that filter; the others are still checked per candidate.
local srcs, upl = {}, ups
local sufs = asufs(proto, region, carrier)
if #sufs > 0 then
  if #upl == 0 then upl = redis.call('SMEMBERS', K .. 'ups') end
  local suf, least
  for _, x in ipairs(sufs) do
    local n = 0
    for _, up in ipairs(upl) do n = n + redis.call('ZCARD', frkey(up) .. x) end
    if not least or n < least then suf, least = x, n end
  end
  for _, up in ipairs(upl) do srcs[#srcs + 1] = source(frkey(up) .. suf, #upl > 1) end
elseif #ups == 0 then
  srcs[1] = source(GFREE, false)
else
  for _, up in ipairs(ups) do srcs[#srcs + 1] = source(frkey(up), #ups > 1) end
end
local picked, examined = {}, 0
while #picked < count and examined < maxExamined do
  -- The best head: highest score, ties the greater member (newest
  -- admission), the order of each index.
  local best, bm, bs
  for _, src in ipairs(srcs) do
    local m, sc = head(src)
    if m and (not best or sc > bs or (sc == bs and m > bm)) then best, bm, bs = src, m, sc end
  end
  if not best then break end
  best.i = best.i + (best.scored and 2 or 1)
  examined = examined + 1
  local id = idOf(bm)
  local f = read(id, CHECK, SELC)
  if eligible(f, bm) then picked[#picked + 1] = {m = bm, id = id, f = f} end
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
local reply, byUp, upNames, all = {'F'}, {}, {}, {}
local nows, sextracted = s(now), tostring(EXTRACTED)
for _, p in ipairs(picked) do
  local f = p.f
  local up, dl = f[UP], f[DL]
  if #REST > 0 then read(p.id, REST, SELR, f) end
  redis.call('HSET', pkey(p.id), 'st', sextracted, 'xa', nows, 'xc', client)
  local g = byUp[up]
  if not g then
    g = {ids = {}, ms = {}, moved = {}, slots = 0, attr = {}}
    byUp[up] = g
    upNames[#upNames + 1] = up
  end
  g.ids[#g.ids + 1] = p.id
  g.ms[#g.ms + 1] = p.m
  g.moved[#g.moved + 1] = dl
  g.moved[#g.moved + 1] = p.id
  g.slots = g.slots + slotsOf(p.m)
  for _, x in ipairs(asufs(f[SC], f[RG], f[CR])) do
    local a = g.attr[x]
    if not a then a = {}; g.attr[x] = a end
    a[#a + 1] = p.m
  end
  all[#all + 1] = p.m
  f[ID], f[ST], f[DL], f[XC] = p.id, sextracted, nows, client
  reply[#reply + 1] = f
end
for _, up in ipairs(upNames) do
  local g = byUp[up]
  changedAll(g.ids)
  bulk('ZREM', skey(up, AVAILABLE), g.ids)
  bulk('ZADD', skey(up, EXTRACTED), g.moved)
  -- Every picked member is in the AVAILABLE index: it was AVAILABLE with
  -- this very member.
  bulk('ZREM', avkey(up), g.ms)
  redis.call('DECRBY', sskey(up), g.slots)
  bulk('ZREM', frkey(up), g.ms)
  for x, ms in pairs(g.attr) do bulk('ZREM', frkey(up) .. x, ms) end
end
if #all > 0 then bulk('ZREM', GFREE, all) end
if ikey ~= '' then
  local out = {}
  for i = 2, #reply do encode(out, reply[i]) end
  redis.call('SET', idk, fp .. '\n' .. table.concat(out), 'PX', ittl)
end
return reply
