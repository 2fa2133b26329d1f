--[[
An operator's release (celery lease release): delete the lease while the given token holds
it. Nothing notes the token as the last to end: the holder did not end.

KEYS[1]  the lease key

ARGV[1]  the holder's token, as read by the operator

Returns:
  1  deleted
  0  ARGV[1] no longer held the key
]]
--@include held.lua
if mine then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
