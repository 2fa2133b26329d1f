--[[
Note a lease key for the crash sweep to look at, at a time of the store's clock: a sorted set
of lease keys scored by int milliseconds of TIME. Only a hint: each decision is the look's
own script, on the lease key's node.

KEYS[1]  the sweep's sorted set (<prefix>:{celery-lease:handoff}:index)

ARGV[1]  the lease key to look at
ARGV[2]  in how long to look, int milliseconds
ARGV[3]  the set's lifetime, int milliseconds (raised to it, never lowered)
ARGV[4]  optional: '1' to keep an earlier note of the key (a debounce burst's first publish:
         a note is then never put off), else the note is moved to the new time

Returns:
  the score written (int milliseconds of the store's clock)
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local at = clock_ms() + tonumber(ARGV[2])
local earlier = ARGV[4] == '1' and tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '')
if earlier and earlier <= at then
  at = earlier
else
  redis.call('ZADD', KEYS[1], string.format('%.0f', at), ARGV[1])
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return at
