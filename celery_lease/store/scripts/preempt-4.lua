--[[
Take a lease over from the execution holding it (lease_on_conflict="preempt"): in one script,
replace the holder's token with the newcomer's and issue a higher fencing token, so that the
old holder's renewals and token-checked writes are refused from this moment, and no third
execution can take the key in between. Only the holder the newcomer saw (ARGV[7]) is replaced:
a key that changed hands meanwhile is answered as held, and a cooldown record (its holder JSON
starts with "cooldown_until_ms") is never taken over. The newcomer's holder JSON gains
"preempted": the token it replaced, so that an old holder whose notice was lost can tell, from
its refused renewal, that it was taken over (and wake a newcomer waiting out its grace). A key
found free is granted as acquire-4.lua grants it (a hand-over reservation of it honoured: a
reservation only ever holds a free key). KEYS and
ARGV 1 to 6 are acquire-4.lua's: an execution whose message claimed the key's waiting slot
(lease_dedupe) passes the claim key, and the take-over clears the claim when it names this
task id (includes/clear_claim.lua), in the same script, as a grant does. A repeat with the same
token (its first reply was lost) is granted again with the same fencing token. Checks come
before writes; SET, the only write refused under maxmemory, is the first.

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

Returns {granted, answer, pttl}, as acquire-4.lua does:
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
--@include next_fence.lua
if not fence then return refusal end
local value = ARGV[1] .. ':' .. fence .. ':' .. holder
if cur then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
else  -- a free key: as acquire-4.lua, a hand-over's reservation holds it
  --@include reserved.lua
  redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
  if reserved_for and reserved_for == ARGV[5] then
    redis.call('HDEL', KEYS[3], 'id', 'due', 'el')
  end
end
local ended = string.match(last, '^%d+:(.+)$')
redis.call('SET', KEYS[2], ended and (fence .. ';' .. ended) or fence, 'PX', ARGV[4])
if KEYS[4] then
  --@include clear_claim.lua
end
return {1, fence, tonumber(ARGV[2])}
