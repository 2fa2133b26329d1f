--[[
Renew one slot of a limited key: its deadline moves to the store's clock plus the TTL while
the token has a live slot there. Safe to repeat. Used on Redis Cluster and with
lease_min_replicas, one call per lease.

KEYS[1]  the lease key (a hash of slots)

ARGV[1]  the holder's token
ARGV[2]  the lifetime, int milliseconds (the TTL)

Returns:
  1   renewed
  0   the key is absent
  -1  no live slot of this token there, or a key of another type: held by another
  an error reply: the store refused the write (maxmemory, an ACL without HSET)
]]
--@include clock.lua
--@include renew_slot.lua
local done = renew_slot(KEYS[1], ARGV[1], ARGV[2])
if done == '1' then return 1 elseif done == '0' then return 0 elseif done == '2' then
  return -1
end
return done
