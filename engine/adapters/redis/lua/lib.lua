-- Shared prologue of every script (prepended by scripts.go).
-- ARGV[1] is the key prefix including the hash tag ("{proxypool}:2:"),
-- ARGV[2] the generation the caller believes in. Every key is derived from
-- the prefix, so all of them live in one cluster slot; KEYS[1] is the
-- generation key, declared for routing.
local K = ARGV[1]
local GEN = ARGV[2]

-- Numbers are written with %.0f: Lua's tostring would print microsecond
-- timestamps in exponent form and lose digits.
local function s(x) return string.format('%.0f', x) end
local function num(x) return tonumber(x) or 0 end

local function nowus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function genmismatch()
  local g = redis.call('GET', K .. 'gen')
  if g ~= GEN then return {'GEN', g or ''} end
  return nil
end

-- States (proxy.State): 1 FETCHED 2 CHECKING 3 AVAILABLE 4 SUSPECT
-- 5 UNHEALTHY 6 DRAINING 7 EXTRACTED 8 EXPIRED 9 REMOVED; 1..6 are managed.
local AVAILABLE, EXTRACTED, EXPIRED, UNHEALTHY, REMOVED = 3, 7, 8, 5, 9

local function pkey(id) return K .. 'p:' .. id end
local function skey(up, st) return K .. 'u:' .. up .. ':s:' .. st end
local function avkey(up) return K .. 'u:' .. up .. ':av' end
local function frkey(up) return K .. 'u:' .. up .. ':fr' end
local function sskey(up) return K .. 'u:' .. up .. ':ss' end
local function owkey(w) return K .. 'ow:' .. w end
local GFREE = K .. 'fr'

-- The change log (ChangeFeed): every script that changes a proxy — a field
-- of its hash, its state, its deletion, or the expiry of its key noticed —
-- records its id in the sorted set CHANGES, scored by the script's version:
-- one INCR of CVER per script that changes anything, one ZADD per proxy or
-- per batch of them (a proxy changed again moves to the later version, so
-- it appears once).
-- Trimming drops the lowest versions and raises CFLOOR to the highest one
-- dropped: a reader behind it cannot know what it missed.
local CHANGES, CVER, CFLOOR = K .. 'changes', K .. 'changes:v', K .. 'changes:floor'
local version
local function changed(id)
  if not version then version = s(redis.call('INCR', CVER)) end
  redis.call('ZADD', CHANGES, version, id)
end

-- changedAll records the ids of a list, 500 per ZADD.
local function changedAll(ids)
  if #ids == 0 then return end
  if not version then version = s(redis.call('INCR', CVER)) end
  for i = 1, #ids, 500 do
    local args, n = {}, 0
    for j = i, math.min(i + 499, #ids) do
      args[n + 1], args[n + 2] = version, ids[j]
      n = n + 2
    end
    redis.call('ZADD', CHANGES, unpack(args))
  end
end

-- dropExpired drops from a state index at most limit ids of entries Redis
-- already expired (score, the key's deadline, before nowms), recording
-- each as a change (nothing else would: the key just vanished), and
-- returns how many it dropped.
local function dropExpired(key, nowms, limit)
  local ids = redis.call('ZRANGEBYSCORE', key, '-inf', '(' .. nowms, 'LIMIT', 0, limit)
  changedAll(ids)
  for i = 1, #ids, 1000 do redis.call('ZREM', key, unpack(ids, i, math.min(i + 999, #ids))) end
  return #ids
end

-- trimLog drops the lowest versions of the change log beyond maxLen
-- entries, at most limit per call, raising the floor.
local function trimLog(maxLen, limit)
  local n = math.min(redis.call('ZCARD', CHANGES) - maxLen, limit)
  if n <= 0 then return end
  local last = redis.call('ZRANGE', CHANGES, n - 1, n - 1, 'WITHSCORES')
  redis.call('ZREMRANGEBYRANK', CHANGES, 0, n - 1)
  redis.call('SET', CFLOOR, s(tonumber(last[2])))
end

-- An index member is 16 hex digits of admission sequence (equal scores
-- sort newest admission first), 8 hex digits of slots (so the slot sum can
-- be corrected even after Redis expired the proxy's key) and the id.
local function member(seq, slots, id) return string.format('%016x%08x', seq, slots) .. id end
local function idOf(m) return string.sub(m, 25) end
local function slotsOf(m) return tonumber(string.sub(m, 17, 24), 16) end

local function fxkey(up) return K .. 'u:' .. up .. ':fx' end

-- An unowned AVAILABLE entry is also in a free index per attribute of its
-- upstream — region, carrier, scheme, each when set — so that a filtered
-- extraction walks the entries that match instead of re-reading the ones
-- that do not. asufs gives the suffixes of those keys (after frkey(up));
-- fxkey(up) is the set of the attribute index keys in use, for Sweep.
local function asufs(sc, rg, cr)
  local t = {}
  if rg and rg ~= '' then t[#t + 1] = ':r:' .. rg end
  if cr and cr ~= '' then t[#t + 1] = ':c:' .. cr end
  if sc and sc ~= '' then t[#t + 1] = ':p:' .. sc end
  return t
end
-- An entry's attributes, read with HMGET sc rg cr.
local ATTRS = {'sc', 'rg', 'cr'}

-- freeAdd and freeDel enter and drop an entry in every free index: its
-- upstream's, the global one and its upstream's per attribute; a is the
-- entry's asufs.
local function freeAdd(up, m, uu, a)
  redis.call('ZADD', frkey(up), uu, m)
  redis.call('ZADD', GFREE, uu, m)
  for _, suf in ipairs(a) do
    local k = frkey(up) .. suf
    if redis.call('ZADD', k, uu, m) == 1 and redis.call('ZCARD', k) == 1 then redis.call('SADD', fxkey(up), k) end
  end
end

local function freeDel(up, m, a)
  redis.call('ZREM', frkey(up), m)
  redis.call('ZREM', GFREE, m)
  for _, suf in ipairs(a) do redis.call('ZREM', frkey(up) .. suf, m) end
end

-- addAvail enters an AVAILABLE entry in its upstream's AVAILABLE index
-- (with its slots in the running sum) and, when unowned, in the free
-- indexes extraction walks.
local function addAvail(up, m, uu, owner, a)
  redis.call('ZADD', avkey(up), uu, m)
  redis.call('INCRBY', sskey(up), slotsOf(m))
  if owner == '' then freeAdd(up, m, uu, a) end
end

local function delAvail(up, m, a)
  if redis.call('ZREM', avkey(up), m) == 1 then redis.call('DECRBY', sskey(up), slotsOf(m)) end
  freeDel(up, m, a)
end

-- delEntry deletes a proxy and every index entry it has (a change).
local function delEntry(id, st, up, m, ow)
  redis.call('ZREM', skey(up, st), id)
  if st == AVAILABLE then
    local a = redis.call('HMGET', pkey(id), unpack(ATTRS))
    delAvail(up, m, asufs(a[1], a[2], a[3]))
  end
  if ow and ow ~= '' then redis.call('SREM', owkey(ow), id) end
  redis.call('DEL', pkey(id))
  changed(id)
end

-- move changes the state of an entry read with HMGET CORE (a change).
local function move(id, e, to)
  local st, up, m, ow, dl = tonumber(e[1]), e[2], e[3], e[4], e[5]
  redis.call('ZREM', skey(up, st), id)
  redis.call('ZADD', skey(up, to), dl, id)
  redis.call('HSET', pkey(id), 'st', to)
  changed(id)
  if st == AVAILABLE or to == AVAILABLE then
    local a = asufs(e[7], e[8], e[9])
    if st == AVAILABLE then delAvail(up, m, a) end
    if to == AVAILABLE then addAvail(up, m, e[6], ow or '', a) end
  end
end
local CORE = {'st', 'up', 'm', 'ow', 'dl', 'uu', 'sc', 'rg', 'cr'}

-- Every field of a proxy hash, in the order the Go decoder expects.
local FIELDS = {'id', 'sc', 'h', 'po', 'un', 'cv', 'pw', 'up', 'ca', 'ex', 'uu', 'lc', 'ls', 'lat', 'mc', 'st', 'cf', 'rg', 'cr', 'tg', 'ow', 'xa', 'xc'}

-- encode appends the fields of one proxy as length-prefixed strings, so any
-- byte (passwords, tags) survives. lens caches the "<length>:" prefixes:
-- formatting a number is the costly part.
local NFIELDS = #FIELDS
local lens = {}
local function encode(out, vals)
  local n = #out
  for i = 1, NFIELDS do
    local v = vals[i] or ''
    local l = #v
    local p = lens[l]
    if not p then p = l .. ':'; lens[l] = p end
    out[n + 1], out[n + 2] = p, v
    n = n + 2
  end
end
