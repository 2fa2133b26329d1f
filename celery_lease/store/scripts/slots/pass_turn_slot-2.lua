--[[
Pass a waiting hold's turn on for a key of N slots (hold(limit=N), as lease/pass_turn-2.lua
does for a plain key): while fewer than N slots are held, wake the next waiter (slots past
their deadline are deleted on the way, as an acquire deletes them); while all N are held, do
nothing (a holder's release wakes one).

KEYS[1]  the lease key (a hash of slots, or absent)
KEYS[2]  the wake list key (same hash tag)

ARGV[1]  the wake element's lifetime, int milliseconds
ARGV[2]  the limit N, int >= 2

Returns:
  1     a slot was free: one waiter woken
  0     all N slots are held (or the key is of another type): nothing done
  text  the error text of the refused RPUSH or PEXPIRE (a slot was free; nobody woken)
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
--@include count_slots.lua
if count_slots(KEYS[1], clock_ms()) >= tonumber(ARGV[2]) then return 0 end
--@include wake.lua
return wake(KEYS[2], '1', ARGV[1]) or 1
