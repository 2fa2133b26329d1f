--[[
Take a lease: grant a free key (SET NX PX) with a new fencing token, unless a hand-over
reserved it for another task id; a repeat with the same token is granted again. A grant also
ends its task id's reservation and its claim.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the reservation hash key (same hash tag)
KEYS[4]  optional: the claim key (<lease key>:waiting, same hash tag), for a claimed message

ARGV[1]  the token of the execution taking the lease (32 hex characters)
ARGV[2]  the lease's lifetime, int milliseconds (the TTL)
ARGV[3]  the holder JSON (task, task id, host, pid)
ARGV[4]  the fencing counter's lifetime, int milliseconds (the TTL plus an hour)
ARGV[5]  the task id of the execution taking the lease ('' for none)
ARGV[6]  '1' when the execution is a handed-over run (header lease_handoff), else '0'

Returns {granted, answer, pttl}:
  {1, fence, ARGV[2]}  granted now; answer is the fencing token alone (digits)
  {1, fence, ARGV[2], message}  granted now to the reserved run a later duplicate joined:
                       message is the latest one kept (its arguments win)
  {1, value, pttl}     the key holds this token already (a repeat); answer is the whole value
  {0, value, pttl}     held by another token; value is "<token>:<fencing token>:<holder JSON>"
                       and pttl its lifetime left, int milliseconds (-1: none)
  {0, '', pttl}        a key of another type at KEYS[1], or a counter not ours at KEYS[2]
                       (pttl: that key's lifetime left)
  {0, 'reserved:<id>', ms}  free, but reserved for task id <id> for ms more milliseconds
  {0, 'ran:<id>', 0}   a handed-over run whose task id already ran to its release (a copy
                       published twice): not to run again
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include held.lua
if cur then
  return {mine and 1 or 0, cur, redis.call('PTTL', KEYS[1])}
end
--@include clock.lua
--@include fence.lua
--@include reservation.lua
local now = clock_us()
local fence, last, refusal = next_fence(KEYS[2], now)
local ours, joined, refused = reservation(KEYS[3], ARGV[5], ARGV[6] == '1', now / 1000)
if refused then return refused end
if not fence then return refusal end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. fence .. ':' .. ARGV[3], 'NX', 'PX', ARGV[2])
write_fence(KEYS[2], fence, last, ARGV[4])
local latest = ours and take_reservation(KEYS[3], joined)
if KEYS[4] then
  --@include claim.lua
  clear_claim(KEYS[4], ARGV[5])
end
if latest then return {1, fence, tonumber(ARGV[2]), latest} end
return {1, fence, tonumber(ARGV[2])}
