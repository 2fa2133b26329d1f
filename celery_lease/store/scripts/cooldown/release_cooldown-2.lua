--[[
Release a lease into a cooldown (lease_cooldown): while the token holds the key, turn the
lease into a cooldown record in the same write (no instant in which the key is free), with
the cooldown as its lifetime. Safe to repeat; a refused record still releases the key.

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
  --@include clock.lua
  local until_ms = clock_ms() + tonumber(ARGV[2])
  local record = head .. '{"cooldown_until_ms":' .. string.format('%.0f', until_ms) .. ','
    .. string.sub(meta, 2)
  local refused = redis.pcall('SET', KEYS[1], record, 'PX', ARGV[2]).err  -- nil: written
  if refused then redis.call('DEL', KEYS[1]) end
  --@include note_ended.lua
  if counter or not noted then  -- our counter (lib/note_ended.lua's locals), never another's
    local needed = tonumber(ARGV[2]) + tonumber(ARGV[3])
    if redis.call('PTTL', KEYS[2]) < needed then redis.pcall('PEXPIRE', KEYS[2], needed) end
  end
  if refused then return refused end
  return 1
end
--@include released_before.lua
