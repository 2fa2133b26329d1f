--[[
An operator's release of one slot of a limited key (celery lease release): delete this
token's slot, and only it, as lease/revoke-1.lua does for a plain lease.

KEYS[1]  the lease key (a hash of slots)

ARGV[1]  the holder's token, as read by the operator

Returns:
  1  deleted
  0  ARGV[1] had no slot there (or the key is of another type)
]]
if redis.pcall('HDEL', KEYS[1], ARGV[1]) ~= 1 then return 0 end
if redis.call('HLEN', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[1], 'n') == 1 then
  redis.call('DEL', KEYS[1])
end
return 1
