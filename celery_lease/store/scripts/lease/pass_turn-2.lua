--[[
Pass a waiting hold's turn on (celery_lease.hold_async: a cancelled waiter may have taken a
release's wake element): while the lease key is free, wake the next waiter; while it is held,
do nothing (its holder's release wakes one).

KEYS[1]  the lease key
KEYS[2]  the wake list key (same hash tag)

ARGV[1]  the wake element's lifetime, int milliseconds

Returns:
  1     the key was free: one waiter woken
  0     the key is held: nothing done
  text  the error text of the refused RPUSH or PEXPIRE (the key was free; nobody woken)
]]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
--@include wake.lua
return wake(KEYS[2], '1', ARGV[1]) or 1
