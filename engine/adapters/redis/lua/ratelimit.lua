-- ARGV: 3 key, 4 emission interval µs (period / limit), 5 burst.
-- GCRA: one key per client holding the theoretical arrival time.
local bad = genmismatch(); if bad then return bad end
local now = nowus()
local k = K .. 'rl:' .. ARGV[3]
local em, burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local tat = math.max(num(redis.call('GET', k)), now)
local newtat = tat + em
local diff = now - (newtat - em * burst)
if diff < 0 then return {'OK', 0, 0, s(-diff)} end
redis.call('SET', k, s(newtat), 'PX', s(math.ceil((newtat - now) / 1000) + 1))
return {'OK', 1, math.floor(diff / em), '0'}
