--[[
Renew one lease: set its lifetime back to the TTL (PEXPIRE sets, never adds) while the token
still holds it. Safe to repeat. PEXPIRE is not refused under maxmemory, so renewals keep
working on a full server. Used on Redis Cluster, where one call holds one key's slot. A key of
another type than a string is renewed as a slot of a limited key when it is a hash of slots
(lease_limit=N, includes/renew_slot.lua: only this token's slot).

KEYS[1]  the lease key

ARGV[1]  the holder's token
ARGV[2]  the lifetime, int milliseconds (the TTL)

Returns:
  1   renewed
  0   the key is absent (expired, deleted)
  -1  the key is held by another token
]]
--@include renew_slot.lua
--@include held.lua
if cur == '' then  -- another type than a string: a hash of slots, or not ours
  local slot = renew_slot(KEYS[1], ARGV[1], tonumber(ARGV[2]))
  if slot == '1' then return 1 elseif slot == '2' then return -1 end
  return slot
end
if mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return -1 end
return 0
