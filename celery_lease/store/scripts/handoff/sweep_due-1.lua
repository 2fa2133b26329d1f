--[[
Take the lease keys the crash sweep should look at now (scored at or before the store's
clock), at most ARGV[1], and score each ARGV[2] ms ahead, so that one sweep at a time looks
at a key.

KEYS[1]  the sweep's sorted set (see handoff/watch-1.lua)

ARGV[1]  the most keys to take
ARGV[2]  how far ahead to score the keys taken, int milliseconds

Returns a flat list: lease key, the score it was given (int milliseconds), lease key, ...
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now_ms = clock_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, ARGV[1])
local out, ahead = {}, string.format('%.0f', now_ms + tonumber(ARGV[2]))
for _, key in ipairs(due) do
  redis.call('ZADD', KEYS[1], ahead, key)
  out[#out + 1] = key
  out[#out + 1] = ahead
end
return out
