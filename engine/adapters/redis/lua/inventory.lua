-- ARGV: 3 upstream, 4 now µs ('' = server time). Managed and Pending are counts of the state
-- indexes; Available and AvailableSlots come from the AVAILABLE index and
-- its running slot sum, correcting by whichever side of now is smaller, so
-- the cost is O(log n + min(usable, unusable)).
local bad = genmismatch(); if bad then return bad end
local up, now = ARGV[3], tonumber(ARGV[4]) or nowus()
local nowms = s(math.floor(nowus() / 1000))
local managed, pending = 0, 0
for st = 1, 6 do
  local c = redis.call('ZCOUNT', skey(up, st), nowms, '+inf')
  managed = managed + c
  if st <= 2 then pending = pending + c end
end
local av = avkey(up)
local total = redis.call('ZCARD', av)
local usable = redis.call('ZCOUNT', av, '(' .. s(now), '+inf')
local function sumSlots(lo, hi)
  local sum, off = 0, 0
  while true do
    local ms = redis.call('ZRANGEBYSCORE', av, lo, hi, 'LIMIT', off, 1000)
    if #ms == 0 then break end
    for i = 1, #ms do sum = sum + slotsOf(ms[i]) end
    off = off + #ms
    if #ms < 1000 then break end
  end
  return sum
end
local slots
if usable <= total - usable then
  slots = sumSlots('(' .. s(now), '+inf')
else
  slots = num(redis.call('GET', sskey(up))) - sumSlots('-inf', s(now))
end
return {'OK', managed, usable, s(slots), pending}
