-- ARGV: 3 limit. Forgets dead workers, returns live ones with their info.
local bad = genmismatch(); if bad then return bad end
local nowms = math.floor(nowus() / 1000)
redis.call('ZREMRANGEBYSCORE', K .. 'hb', '-inf', '(' .. s(nowms))
local out = {}
local ws = redis.call('ZRANGE', K .. 'hb', 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
for i = 1, #ws, 2 do
  out[#out + 1] = {ws[i], ws[i + 1], redis.call('HGETALL', K .. 'hb:' .. ws[i])}
end
return {'OK', out}
