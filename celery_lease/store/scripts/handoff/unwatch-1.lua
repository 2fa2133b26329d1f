--[[
Forget a lease key the crash sweep found nothing waiting for, unless it was noted again since
the sweep took it: its score must still be the one handoff/sweep_due-1.lua gave it.

KEYS[1]  the sweep's sorted set (see handoff/watch-1.lua)

ARGV[1]  the lease key
ARGV[2]  the score the sweep gave it, int milliseconds

Returns:
  1  forgotten
  0  noted again since (or already gone): left as it is
]]
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
