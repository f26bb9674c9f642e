-- Returns the live entries per state over every upstream.
local bad = genmismatch(); if bad then return bad end
local nowms = s(math.floor(nowus() / 1000))
local out = {0, 0, 0, 0, 0, 0, 0, 0, 0}
for _, up in ipairs(redis.call('SMEMBERS', K .. 'ups')) do
  for st = 1, 9 do out[st] = out[st] + redis.call('ZCOUNT', skey(up, st), nowms, '+inf') end
end
return {'OK', out}
