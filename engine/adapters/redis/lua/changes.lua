-- ARGV: 3 since (a version of this generation's counter; -1: none),
-- 4 change log length, 5 max change log entries trimmed, 6 max ids
-- answered, 7 max expired ids dropped. Reads the version and the ids
-- changed after since in one step, so a change made later is in a later
-- version. First it drops (recording them) the ids of entries Redis
-- expired from the state indexes — those changes no script saw — and trims
-- the log.
--
-- Replies {'OK', version, ids} or {'RESET', version}: since is before the
-- floor, after the version, or more than the max ids changed since (a
-- listing costs no more), or more expired entries than the max were found
-- (the rest are dropped by the next call, the listing skips them).
local bad = genmismatch(); if bad then return bad end
local since, maxIDs, maxDrop = tonumber(ARGV[3]), tonumber(ARGV[6]), tonumber(ARGV[7])
local nowms = s(math.floor(nowus() / 1000))
local dropped = 0
for _, up in ipairs(redis.call('SMEMBERS', K .. 'ups')) do
  for st = 1, 9 do
    if dropped >= maxDrop then break end
    dropped = dropped + dropExpired(skey(up, st), nowms, maxDrop - dropped)
  end
end
trimLog(tonumber(ARGV[4]), tonumber(ARGV[5]))
local v = num(redis.call('GET', CVER))
local vs = s(v)
if dropped >= maxDrop or since < num(redis.call('GET', CFLOOR)) or since > v then return {'RESET', vs} end
local after = '(' .. s(since)
if redis.call('ZCOUNT', CHANGES, after, vs) > maxIDs then return {'RESET', vs} end
return {'OK', vs, redis.call('ZRANGEBYSCORE', CHANGES, after, vs)}
