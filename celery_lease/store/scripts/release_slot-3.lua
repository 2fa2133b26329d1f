--[[
Release one slot of a limited key (lease_limit=N, acquire_slot-3.lua) at the end of its
execution: delete this token's field, and only it (the other slots are untouched; the last
field's deletion deletes the hash), and note the token as the last to end beside the fencing
counter (includes/note_ended.lua). With a wake key (a hold's release), push one element to it
so that one waiting hold tries again (as release_wake-3.lua does). Safe to repeat: a repeat
whose first reply was lost answers 1 while no other slot's release noted itself since. HDEL
and DEL are not refused under maxmemory.

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
  if KEYS[3] then  -- as release_wake-3.lua: at most one element, never without a lifetime
    redis.pcall('LTRIM', KEYS[3], 1, 0)
    if type(redis.pcall('RPUSH', KEYS[3], '1')) ~= 'table' and
        type(redis.pcall('PEXPIRE', KEYS[3], ARGV[2])) == 'table' then
      redis.call('DEL', KEYS[3])
    end
  end
  return 1
end
--@include released_before.lua
