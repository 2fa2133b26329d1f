--[[
Forget a lease key the crash sweep found nothing waiting for, unless it was noted again since
the sweep took it (a duplicate parked meanwhile wrote a new score): the score must still be
the one the sweep gave it (sweep_due-1.lua).

KEYS[1]  the sweep's sorted set (see watch-1.lua)

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
