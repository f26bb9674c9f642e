-- ARGV: 3 upstream, 4 now µs ('' = server time). Managed and Pending are counts of the state
-- indexes; Available and AvailableSlots come from the AVAILABLE index and
-- its running slot sum, correcting by whichever side of now is smaller, so
-- the cost is O(log n + min(usable, unusable)); the controller keeps the
-- unusable side small by expiring what passed UsableUntil.
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
-- sumSlots adds the slots of the members ranked first..last (ascending),
-- in pages by rank: each costs O(log n) to find, where a LIMIT offset into
-- a score range would step over every member already summed again.
local function sumSlots(first, last)
  local sum = 0
  for lo = first, last, 1000 do
    local ms = redis.call('ZRANGE', av, lo, math.min(lo + 999, last))
    for i = 1, #ms do sum = sum + slotsOf(ms[i]) end
  end
  return sum
end
-- Ranks 0..total-usable-1 are the unusable members, the rest the usable.
local slots
if usable <= total - usable then
  slots = sumSlots(total - usable, total - 1)
else
  slots = num(redis.call('GET', sskey(up))) - sumSlots(0, total - usable - 1)
end
return {'OK', managed, usable, s(slots), pending}
