--[[
Take back a grant that does not count (fewer replicas than lease_min_replicas acknowledged
it; nobody ran under it): delete the lease while the token holds it and note the token as the
last to end, as lease/release-2.lua does. For a handed-over run, whose grant ended the
hand-over's reservation (lib/reservation.lua), the key is reserved for its task id again
while no other reservation is there, so that the copy of it sent again (lease_on_store_error)
keeps its turn ahead of later duplicates; the reservation holds the key for ARGV[4] ms and
carries no element (past due, the crash sweep hands the key to the line's head). Safe to
repeat.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the reservation hash key (same hash tag)

ARGV[1]  the token of the grant taken back
ARGV[2]  the task id of its execution ('' for none)
ARGV[3]  '1' when the execution is a handed-over run, else '0'
ARGV[4]  how long the reservation holds the key, int milliseconds (the lease's TTL); the
         hash lives twice that when it had no lifetime (it was created here)

Returns:
  2  taken back, and the key reserved for ARGV[2] again
  1  taken back (or by an earlier call with ARGV[1])
  0  ARGV[1] did not hold the key
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include held.lua
if not mine then
  --@include released_before.lua
end
redis.call('DEL', KEYS[1])
--@include note_ended.lua
if ARGV[3] ~= '1' or ARGV[2] == '' or redis.pcall('HEXISTS', KEYS[3], 'id') ~= 0 then
  return 1
end
--@include clock.lua
local due = string.format('%.0f', clock_ms() + tonumber(ARGV[4]))
if type(redis.pcall('HSET', KEYS[3], 'id', ARGV[2], 'due', due)) == 'table' then return 1 end
if redis.call('PTTL', KEYS[3]) < 0 then redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[4])) end
return 2
