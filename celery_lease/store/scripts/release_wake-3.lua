--[[
Release a hold's lease (celery_lease.hold) as release-2.lua does, then put one "free" element
in the key's wake list for a waiting hold's BLPOP. A separate script, so a task's release costs
nothing more. The list is emptied first: it holds at most one element (one waiter woken per
release; it passes the turn on with its own release). pcall: a wake the server refuses (OOM, or
an ACL without RPUSH) does not undo the release; it only leaves the waiters to their fallback,
the holder's expiry. The refusal is answered, not swallowed, and no wake list stays without its
lifetime. A wake key of another type is not ours and is left alone (LTRIM empties a list only).

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
  redis.pcall('LTRIM', KEYS[3], 1, 0)
  local woke = redis.pcall('RPUSH', KEYS[3], '1')
  if type(woke) ~= 'table' then
    woke = redis.pcall('PEXPIRE', KEYS[3], ARGV[2])
    if type(woke) == 'table' then redis.call('DEL', KEYS[3]) end  -- our list: no lifetime
  end
  if type(woke) == 'table' then
    return woke.err
  end
  return 1
end
--@include released_before.lua
