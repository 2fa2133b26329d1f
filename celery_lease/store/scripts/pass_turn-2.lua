--[[
Pass a waiting hold's turn on (celery_lease.hold_async): a waiter cancelled in its BLPOP may have
taken the wake element of a release and never read the reply. While the lease key is free, put
one "free" element in the wake list, as release_wake-3.lua does, so that the next waiter is
woken now rather than at the end of its own BLPOP; while the key is held, do nothing (its
holder's release wakes one). A wake-up nobody needed costs a waiter one acquire. A wake the
store refuses (OOM, an ACL user without RPUSH) is answered, as release_wake-3.lua does: the
waiters then take the key at their own BLPOP's end. A wake key of another type is not ours and
is left alone (LTRIM empties a list only), as in release_wake-3.lua.

KEYS[1]  the lease key
KEYS[2]  the wake list key (same hash tag)

ARGV[1]  the wake element's lifetime, int milliseconds

Returns:
  1  the key was free: one waiter woken
  0  the key is held: nothing done
  the error text of the refused RPUSH or PEXPIRE (the key was free; nobody woken)
]]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.pcall('LTRIM', KEYS[2], 1, 0)
local woke = redis.pcall('RPUSH', KEYS[2], '1')
if type(woke) ~= 'table' then
  woke = redis.pcall('PEXPIRE', KEYS[2], ARGV[1])
  if type(woke) == 'table' then redis.call('DEL', KEYS[2]) end  -- our list: no lifetime
end
if type(woke) == 'table' then
  return woke.err
end
return 1
