-- Shared prologue of every script (prepended by scripts.go).
-- ARGV[1] is the key prefix including the hash tag ("{proxypool}:"),
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

-- An index member is 16 hex digits of admission sequence (equal scores
-- sort newest admission first), 8 hex digits of slots (so the slot sum can
-- be corrected even after Redis expired the proxy's key) and the id.
local function member(seq, slots, id) return string.format('%016x%08x', seq, slots) .. id end
local function idOf(m) return string.sub(m, 25) end
local function slotsOf(m) return tonumber(string.sub(m, 17, 24), 16) end

-- addAvail enters an AVAILABLE entry in its upstream's AVAILABLE index
-- (with its slots in the running sum) and, when unowned, in the free
-- indexes extraction walks.
local function addAvail(up, m, uu, owner)
  redis.call('ZADD', avkey(up), uu, m)
  redis.call('INCRBY', sskey(up), slotsOf(m))
  if owner == '' then
    redis.call('ZADD', frkey(up), uu, m)
    redis.call('ZADD', GFREE, uu, m)
  end
end

local function delAvail(up, m)
  if redis.call('ZREM', avkey(up), m) == 1 then redis.call('DECRBY', sskey(up), slotsOf(m)) end
  redis.call('ZREM', frkey(up), m)
  redis.call('ZREM', GFREE, m)
end

-- delEntry deletes a proxy and every index entry it has.
local function delEntry(id, st, up, m, ow)
  redis.call('ZREM', skey(up, st), id)
  if st == AVAILABLE then delAvail(up, m) end
  if ow and ow ~= '' then redis.call('SREM', owkey(ow), id) end
  redis.call('DEL', pkey(id))
end

-- move changes the state of an entry read with HMGET st up m ow dl uu mc.
local function move(id, e, to)
  local st, up, m, ow, dl = tonumber(e[1]), e[2], e[3], e[4], e[5]
  redis.call('ZREM', skey(up, st), id)
  redis.call('ZADD', skey(up, to), dl, id)
  redis.call('HSET', pkey(id), 'st', to)
  if st == AVAILABLE then delAvail(up, m) end
  if to == AVAILABLE then addAvail(up, m, e[6], ow or '') end
end
local CORE = {'st', 'up', 'm', 'ow', 'dl', 'uu'}

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
