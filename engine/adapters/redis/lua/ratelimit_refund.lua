-- ARGV: 3 key, 4 µs to give back (units × emission interval).
-- Moves the key's theoretical arrival time back, never before now: units
-- AllowN took and the caller did not use are free again, and never more.
local bad = genmismatch(); if bad then return bad end
local now = nowus()
local k = K .. 'rl:' .. ARGV[3]
local tat = num(redis.call('GET', k))
if tat <= now then return {'OK'} end
local newtat = math.max(tat - tonumber(ARGV[4]), now)
if newtat <= now then
  redis.call('DEL', k)
else
  redis.call('SET', k, s(newtat), 'PX', s(math.ceil((newtat - now) / 1000) + 1))
end
return {'OK'}
