--[[
Renew one slot of a limited key (lease_limit=N, acquire_slot-3.lua): its deadline moves to the
store's clock plus the TTL while the token still has a live slot there (token-checked: no other
slot is touched), and the hash's lifetime is raised to cover it. Safe to repeat. Used on Redis
Cluster and with lease_min_replicas, where renewals go one script per lease, as renew-1.lua.

KEYS[1]  the lease key (a hash of slots)

ARGV[1]  the holder's token
ARGV[2]  the lifetime, int milliseconds (the TTL)

Returns:
  1   renewed
  0   the key is absent
  -1  no live slot of this token there, or a key of another type: held by another
  an error reply: the store refused the write (maxmemory, an ACL without HSET)
]]
--@include renew_slot.lua
local done = renew_slot(KEYS[1], ARGV[1], ARGV[2])
if done == '1' then return 1 elseif done == '0' then return 0 elseif done == '2' then
  return -1
end
return done
