--[[
Take a lease over from the execution holding it (lease_on_conflict="preempt"): in one script,
replace the holder's token with the newcomer's and issue a higher fencing token, so that the
old holder's renewals and token-checked writes are refused from this moment, and no third
execution can take the key in between. Only the holder the newcomer saw (ARGV[5]) is replaced:
a key that changed hands meanwhile is answered as held, and a cooldown record (its holder JSON
starts with "cooldown_until_ms") is never taken over. A key found free is granted as
acquire-2.lua grants it. A repeat with the same token (its first reply was lost) is granted
again with the same fencing token. Checks come before writes; SET, the only write refused
under maxmemory, is the first.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)

ARGV[1]  the newcomer's token (32 hex characters)
ARGV[2]  the lease's lifetime, int milliseconds (the TTL)
ARGV[3]  the newcomer's holder JSON
ARGV[4]  the fencing counter's lifetime, int milliseconds (the TTL plus an hour)
ARGV[5]  the token of the holder to take over from

Returns {granted, answer, pttl}, as acquire-2.lua does:
  {1, fence, ARGV[2]}  taken over (or the key was free); answer is the fencing token alone
  {1, value, pttl}     the key holds this token already (a repeat)
  {0, value, pttl}     held by another holder than ARGV[5], or a cooldown record
  {0, '', pttl}        a key of another type, or a counter not ours
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include held.lua
if mine then
  return {1, cur, redis.call('PTTL', KEYS[1])}
end
if cur then
  local head = ARGV[5] .. ':'
  local meta = string.match(cur, '^[^:]+:%d+:(.*)$') or ''
  if string.sub(cur, 1, #head) ~= head or string.sub(meta, 1, 19) == '{"cooldown_until_ms' then
    return {0, cur, redis.call('PTTL', KEYS[1])}
  end
end
--@include next_fence.lua
if not fence then return refusal end
local value = ARGV[1] .. ':' .. fence .. ':' .. ARGV[3]
if cur then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
end
local ended = string.match(last, '^%d+:(.+)$')
redis.call('SET', KEYS[2], ended and (fence .. ';' .. ended) or fence, 'PX', ARGV[4])
return {1, fence, tonumber(ARGV[2])}
