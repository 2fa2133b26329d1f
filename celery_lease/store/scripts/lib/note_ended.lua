--[[
Note the releasing token as the last to end, beside the fencing counter ("<counter>:<token>",
"0:<token>" for a lapsed counter); a counter this library did not write is left as it is.

KEYS[2]  the fencing counter key
ARGV[1]  the releasing holder's token

Defines:
  noted    the counter's value before (false when absent)
  counter  its leading digits, or nil when it is not ours (or absent)
]]
local noted = redis.pcall('GET', KEYS[2])
local counter = type(noted) == 'string' and string.match(noted, '^%d+')
if counter then
  redis.pcall('SET', KEYS[2], counter .. ':' .. ARGV[1], 'KEEPTTL')
elseif not noted then
  redis.pcall('SET', KEYS[2], '0:' .. ARGV[1], 'PX', 3600000)
end
