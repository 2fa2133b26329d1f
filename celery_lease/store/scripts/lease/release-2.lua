--[[
Release a lease at the end of its execution: delete it while the token holds it, and note the
token as the last to end beside the fencing counter. Safe to repeat.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)

ARGV[1]  the holder's token

Returns:
  1  released, now or by an earlier release of ARGV[1]
  0  ARGV[1] did not hold the key (it expired, was revoked or was taken by another holder)
]]
--@include held.lua
if mine then
  redis.call('DEL', KEYS[1])
  --@include note_ended.lua
  return 1
end
--@include released_before.lua
