--[[
Release a lease into a cooldown (lease_cooldown): while the token still holds the key, turn the
lease into a cooldown record in the same write, so that no instant passes in which the key is
free and a copy could start. The record is the lease value with "cooldown_until_ms" (the
store's clock, int milliseconds since the epoch) first in its holder JSON; its lifetime is the
cooldown, counted by the store. It keeps the holder's token and fencing token: acquire-2.lua
finds the key held (the task's conflict policy applies, pttl the cooldown left), an operator's
release (revoke-1.lua) ends it early, and the next grant's fencing token is past it. The token
is noted as the last to end (a redelivered copy is known to have finished), and the fencing
counter lives at least as long as the record plus its usual hour, so that next grant still
counts on from it. A separate script: a release without a cooldown costs nothing more.

Safe to repeat: a repeat finds the record already written and answers 1 without writing (the
cooldown does not start again). SET is refused under maxmemory: then the lease is released
without a cooldown (DEL is never refused) and the refusal is answered, so no copy is blocked by
a key left behind and nothing stays without a lifetime.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)

ARGV[1]  the holder's token
ARGV[2]  the cooldown, int milliseconds (> 0)
ARGV[3]  the fencing counter's lifetime past the record, int milliseconds (an hour)

Returns:
  1     released into a cooldown, now or by an earlier release of ARGV[1]
  0     ARGV[1] did not hold the key (it expired, was revoked or was taken by another holder)
  text  released without a cooldown: the server refused the record (its error message)
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include held.lua
if mine then
  local head, meta = string.match(cur, '^([^:]+:%d+:)(.*)$')
  if string.sub(meta, 1, 19) == '{"cooldown_until_ms' then return 1 end  -- a repeat
  local t = redis.call('TIME')
  local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
  local record = head .. '{"cooldown_until_ms":' .. string.format('%.0f', until_ms) .. ','
    .. string.sub(meta, 2)
  local refused = redis.pcall('SET', KEYS[1], record, 'PX', ARGV[2]).err  -- nil: written
  if refused then redis.call('DEL', KEYS[1]) end
  --@include note_ended.lua
  if counter or not noted then  -- our counter (note_ended.lua's locals), never another's
    local needed = tonumber(ARGV[2]) + tonumber(ARGV[3])
    if redis.call('PTTL', KEYS[2]) < needed then redis.pcall('PEXPIRE', KEYS[2], needed) end
  end
  if refused then return refused end
  return 1
end
--@include released_before.lua
