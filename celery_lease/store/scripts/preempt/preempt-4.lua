--[[
Take a lease over from the holder the newcomer saw (lease_on_conflict="preempt"): replace its
token with the newcomer's and issue a higher fencing token, in one step. A free key is granted
as lease/acquire-4.lua grants it; a cooldown record is never taken over.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the reservation hash key (same hash tag)
KEYS[4]  optional: the claim key (<lease key>:waiting, same hash tag), for a claimed message

ARGV[1]  the newcomer's token (32 hex characters)
ARGV[2]  the lease's lifetime, int milliseconds (the TTL)
ARGV[3]  the newcomer's holder JSON (an object)
ARGV[4]  the fencing counter's lifetime, int milliseconds (the TTL plus an hour)
ARGV[5]  the newcomer's task id ('' for none)
ARGV[6]  '0' (a take-over is never a handed-over run)
ARGV[7]  the token of the holder to take over from (hex)

Returns {granted, answer, pttl}, as lease/acquire-4.lua does:
  {1, fence, ARGV[2]}  taken over (or the key was free); answer is the fencing token alone
  {1, value, pttl}     the key holds this token already (a repeat)
  {0, value, pttl}     held by another holder than ARGV[7], or a cooldown record
  {0, '', pttl}        a key of another type, or a counter not ours
  {0, 'reserved:<id>', ms}  free, but reserved for task id <id> for ms more milliseconds
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include held.lua
if mine then
  return {1, cur, redis.call('PTTL', KEYS[1])}
end
--@include clock.lua
--@include fence.lua
--@include reservation.lua
local holder = ARGV[3]
if cur then
  local head = ARGV[7] .. ':'
  local meta = string.match(cur, '^[^:]+:%d+:(.*)$') or ''
  if not string.match(ARGV[7], '^%x+$') or string.sub(cur, 1, #head) ~= head
      or string.sub(meta, 1, 19) == '{"cooldown_until_ms' then
    return {0, cur, redis.call('PTTL', KEYS[1])}
  end
  holder = string.sub(ARGV[3], 1, -2) .. ',"preempted":"' .. ARGV[7] .. '"}'
end
local now = clock_us()
local fence, last, refusal = next_fence(KEYS[2], now)
if not fence then return refusal end
local value = ARGV[1] .. ':' .. fence .. ':' .. holder
if cur then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
else  -- a free key: as lease/acquire-4.lua, a hand-over's reservation holds it
  local ours, _, refused = reservation(KEYS[3], ARGV[5], ARGV[6] == '1', now / 1000)
  if refused then return refused end
  redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
  if ours then take_reservation(KEYS[3], false) end
end
write_fence(KEYS[2], fence, last, ARGV[4])
if KEYS[4] then
  --@include claim.lua
  clear_claim(KEYS[4], ARGV[5])
end
return {1, fence, tonumber(ARGV[2])}
