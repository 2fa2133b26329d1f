--[[
Release a hold's lease (celery_lease.hold) as lease/release-2.lua does, then wake one waiting
hold: one element in the key's wake list, for its BLPOP.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the wake list key (same hash tag)

ARGV[1]  the holder's token
ARGV[2]  the wake element's lifetime, int milliseconds

Returns:
  1     released (now or before), and one waiter woken when released now
  0     ARGV[1] did not hold the key
  text  released now, but the wake was refused: the server's error message (a string)
]]
--@include held.lua
if mine then
  redis.call('DEL', KEYS[1])
  --@include note_ended.lua
  --@include wake.lua
  return wake(KEYS[3], '1', ARGV[2]) or 1
end
--@include released_before.lua
