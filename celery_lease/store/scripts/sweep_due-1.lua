--[[
Take the lease keys the crash sweep should look at now (their score is at or before the
store's clock), at most ARGV[1] of them, and score each ARGV[2] milliseconds ahead, so that
another worker's sweep passes over them meanwhile (each key is looked at by one sweep at a
time; one that dies mid-look leaves the key to the next pass after ARGV[2]).

KEYS[1]  the sweep's sorted set (see watch-1.lua)

ARGV[1]  the most keys to take
ARGV[2]  how far ahead to score the keys taken, int milliseconds

Returns a flat list: lease key, the score it was given (int milliseconds), lease key, ...
]]
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, ARGV[1])
local out, ahead = {}, string.format('%.0f', now_ms + tonumber(ARGV[2]))
for _, key in ipairs(due) do
  redis.call('ZADD', KEYS[1], ahead, key)
  out[#out + 1] = key
  out[#out + 1] = ahead
end
return out
