-- ARGV: 3 upstream, 4 maxSize, 5 grace ms, 6 n, then n records of 14
-- fields: id sc h po un cv pw ca ex uu mc rg cr tg (times in µs, '' zero).
local bad = genmismatch(); if bad then return bad end
local up, maxSize, grace, n = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = nowus()
local nowms = math.floor(now / 1000)
local managed = 0
if maxSize > 0 then
  -- Entries whose key expired server-side leave their id behind, scored
  -- by that deadline: they are not counted (Sweep and Changes drop them,
  -- recording the change).
  for st = 1, 6 do managed = managed + redis.call('ZCOUNT', skey(up, st), s(nowms), '+inf') end
end
local added, dup, full = {}, 0, 0
for i = 0, n - 1 do
  local b = 6 + i * 14
  local id = ARGV[b + 1]
  local pk = pkey(id)
  local cur = redis.call('HMGET', pk, 'st', 'up', 'm', 'ow', 'ex')
  local take = true
  if cur[1] then
    local st = tonumber(cur[1])
    if st ~= EXPIRED and st ~= REMOVED and num(cur[5]) > now then
      dup = dup + 1
      take = false
    else
      -- The old lifecycle is over: its entry only waited for expiry.
      delEntry(id, st, cur[2], cur[3], cur[4])
      if cur[2] == up and st <= 6 then managed = managed - 1 end
    end
  end
  if take then
    if maxSize > 0 and managed >= maxSize then
      full = full + 1
    else
      local seq = redis.call('INCR', K .. 'seq')
      -- The member orders ties in the indexes: newest admission first.
      local m = member(seq, math.min(math.max(num(ARGV[b + 11]), 0), 4294967295), id)
      local ex = tonumber(ARGV[b + 9])
      local dl = math.floor(math.max(ex, now) / 1000) + grace
      local ca = ARGV[b + 8]
      if ca == '' then ca = s(now) end
      redis.call('HSET', pk, 'id', id, 'sc', ARGV[b + 2], 'h', ARGV[b + 3], 'po', ARGV[b + 4], 'un', ARGV[b + 5],
        'cv', ARGV[b + 6], 'pw', ARGV[b + 7], 'ca', ca, 'ex', ARGV[b + 9], 'uu', ARGV[b + 10], 'mc', ARGV[b + 11],
        'rg', ARGV[b + 12], 'cr', ARGV[b + 13], 'tg', ARGV[b + 14], 'up', up, 'st', 1, 'm', m, 'dl', s(dl),
        'ow', '', 'lc', '', 'ls', '', 'lat', '0', 'cf', '0', 'xa', '', 'xc', '')
      redis.call('PEXPIREAT', pk, s(dl))
      redis.call('ZADD', skey(up, 1), s(dl), id)
      managed = managed + 1
      added[#added + 1] = id
    end
  end
end
if #added > 0 then redis.call('SADD', K .. 'ups', up) end
changedAll(added)
return {'OK', dup, full, added}
