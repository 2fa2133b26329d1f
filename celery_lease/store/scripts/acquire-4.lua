--[[
Take a lease: a conditional create with its lifetime in the same write (SET NX PX), which also
issues the fencing token. A repeat with the same token (its first reply was lost) finds its own
value and is granted again with the same fencing token: no phantom lease. The fencing token is
max(previous + 1, server time in microseconds): strictly increasing per key across every grant,
even when the counter was evicted or the server restarted empty. The checks come before the
writes, and SET, the only write refused under maxmemory, is the first write: a refused grant
leaves nothing behind, and no key without a lifetime. A free key reserved for another task id
(a run handed the key by release_handoff-4.lua, includes/reserved.lua) counts as held; the
reserved task id takes it and ends the reservation; when a later duplicate joined that
coalesced run (park-3.lua), the grant also answers the duplicate's message, whose arguments
the run takes (an ordinary grant answers no more than before). An execution whose message
claimed the key's waiting slot at publish (lease_dedupe) passes the claim key: a grant clears
the claim when it names this task id (includes/clear_claim.lua), in the same script, so
execution makes no round trip more; a refused grant keeps it (the copy goes on waiting).

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

A fencing counter this library did not write (a key of another type, a value that does not
start with digits, or digits at or above 2^53 - 1, past which Lua numbers stop counting
exactly) refuses the grant, answered as held by an unknown holder: it is never overwritten.

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
--@include next_fence.lua
--@include reserved.lua
if refusal then return refusal end
local value = ARGV[1] .. ':' .. fence .. ':' .. ARGV[3]
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
-- The last release's token stays, after ';' (not ':': released_last no longer names it),
-- for a repeat of that release sent after its reply was lost (see released_before.lua).
local ended = string.match(last, '^%d+:(.+)$')
redis.call('SET', KEYS[2], ended and (fence .. ';' .. ended) or fence, 'PX', ARGV[4])
local latest = false
if reserved_for == ARGV[5] then  -- the reserved run starts: its reservation ends
  if joined then
    latest = string.match(redis.call('HMGET', KEYS[3], 'el')[1] or '', '^[^\n]*\n%d*\n(.*)$')
  end
  redis.call('HDEL', KEYS[3], 'id', 'due', 'el', 'kind', 'new')
end
if KEYS[4] then
  --@include clear_claim.lua
end
if latest then return {1, fence, tonumber(ARGV[2]), latest} end
return {1, fence, tonumber(ARGV[2])}
