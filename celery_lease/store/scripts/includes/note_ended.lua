--[[
Who finished last, noted beside the fencing counter, for released_last() and for a repeated
release. The counter's value becomes "<counter>:<token>". pcall: the note is not needed enough
to fail a release under OOM. A counter that lapsed (a lease renewed for longer than its TTL
plus an hour) is noted as "0:<token>" with the counter's lifetime, 3 600 000 ms
(FENCE_COUNTER_EXTRA_MS in celery_lease/store/protocol.py): the next grant's fencing token then
comes from the server clock, as it would without the key. A counter this library did not write
(another type, another shape) is left as it is.

KEYS[2]  the fencing counter key
ARGV[1]  the releasing holder's token
]]
local noted = redis.pcall('GET', KEYS[2])
local counter = type(noted) == 'string' and string.match(noted, '^%d+')
if counter then
  redis.pcall('SET', KEYS[2], counter .. ':' .. ARGV[1], 'KEEPTTL')
elseif not noted then
  redis.pcall('SET', KEYS[2], '0:' .. ARGV[1], 'PX', 3600000)
end
