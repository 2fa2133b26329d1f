--[[
Renew many slots of limited keys of one TTL in one call, each as slots/renew_slot-1.lua does,
answered with one character per slot. A refused write is the reply of the whole call.

KEYS[1..n]    the lease keys (hashes of slots)
ARGV[1]       the lifetime, int milliseconds (the TTL)
ARGV[2..n+1]  the holders' tokens, in the order of KEYS

Returns a string of n characters, one per slot in the order of KEYS:
  '1'  renewed
  '0'  the key is absent
  '2'  no live slot of this token there (it ended, expired or was deleted), or a key of another
       type than a hash: held by another
]]
--@include clock.lua
--@include renew_slot.lua
local out = {}
for i, key in ipairs(KEYS) do
  local done = renew_slot(key, ARGV[i + 1], ARGV[1])
  if type(done) == 'table' then return done end
  out[i] = done
end
return table.concat(out)
