--[[
An operator's release (celery lease release): delete the lease while the given token holds it.
Unlike release-2.lua nothing records the token as the last to end, since the holder did not end:
a redelivered copy of it runs again, and the holder's own release reports the loss.

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
