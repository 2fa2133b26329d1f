--[[
Release one slot of a limited key at the end of its execution: delete this token's field, and
only it, and note the token as the last to end. With a wake key (a hold's release), wake one
waiting hold. Safe to repeat.

KEYS[1]  the lease key (a hash of slots)
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  optional: the wake list key (same hash tag), for a hold's release

ARGV[1]  the holder's token
ARGV[2]  with KEYS[3]: the wake element's lifetime, int milliseconds

Returns:
  1  released, now or by an earlier release of ARGV[1]
  0  ARGV[1] had no slot there (it expired, was revoked, or the key is of another type)
]]
local gone = redis.pcall('HDEL', KEYS[1], ARGV[1])
if gone == 1 then
  local left = redis.call('HLEN', KEYS[1])
  if left == 1 and redis.call('HEXISTS', KEYS[1], 'n') == 1 then redis.call('DEL', KEYS[1]) end
  --@include note_ended.lua
  if KEYS[3] then
    --@include wake.lua
    wake(KEYS[3], '1', ARGV[2])
  end
  return 1
end
--@include released_before.lua
