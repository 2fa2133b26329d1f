--[[
Renew one lease: set its lifetime back to the TTL (PEXPIRE sets, never adds) while the token
holds it. Safe to repeat. Used on Redis Cluster, one call per key.

KEYS[1]  the lease key

ARGV[1]  the holder's token
ARGV[2]  the lifetime, int milliseconds (the TTL)

Returns:
  1   renewed
  0   the key is absent (expired, deleted)
  -1  the key is held by another token
]]
--@include held.lua
if mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return -1 end
return 0
