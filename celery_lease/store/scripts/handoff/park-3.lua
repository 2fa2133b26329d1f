--[[
Park a duplicate that found its key held (lease_on_conflict "coalesce" or "queue") in the
key's line, unless the key is free by now (then nothing is written and the caller tries
again). A "coalesce" duplicate may instead join the coalesced run the key is reserved for.

KEYS[1]  the lease key
KEYS[2]  the line key (same hash tag)
KEYS[3]  the reservation hash key: id, due, el, kind, new (same hash tag)

ARGV[1]  "coalesce" or "queue"
ARGV[2]  the task id of a new element (coalesce: a fresh id; queue: the duplicate's own)
ARGV[3]  the message to keep (the signature, serialized by the caller)
ARGV[4]  the most elements the line may hold (queue)
ARGV[5]  the line's lifetime, int milliseconds
ARGV[6]  '1' for a copy of a handed-over run (queue: its own task id, ARGV[2]); absent: '0'.
         Any other copy in a queue line is refused once its task id ended for good (noted
         in the reservation's ran field), and is the retry of a handed-over run that retried
         ('~<id>' there): that note is taken out, so that the run it is handed over to is
         not refused as a second copy of the attempt that retried

Returns:
  {1, id, length}  parked: id is the task id of the run that covers it, length the line's
                   (1 for a join of the reserved run)
  {0, 0}           the key is free: nothing written
  {-1, length}     the line is full (queue): nothing written
  {-2, 0}          a copy of a run that already ran to its release (its task id is in the
                   reservation's ran list; for a handed-over copy, also one that retried):
                   nothing written
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now_ms = clock_ms()
local ran = redis.pcall('HGET', KEYS[3], 'ran')
ran = type(ran) == 'string' and ' ' .. ran .. ' ' or ''
local retried = string.find(ran, ' ~' .. ARGV[2] .. ' ', 1, true)
-- A copy sent again after store errors may come back after its run.
if string.find(ran, ' ' .. ARGV[2] .. ' ', 1, true) and (ARGV[6] == '1' or ARGV[1] == 'queue')
    or retried and ARGV[6] == '1' then
  return {-2, 0}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local r = redis.pcall('HMGET', KEYS[3], 'id', 'due')
  if r.err or not r[1] or tonumber(r[2] or '0') <= now_ms then return {0, 0} end
end
if retried and ARGV[1] == 'queue' then  -- its retry: the run handed the key runs it
  local kept = {}
  for id in string.gmatch(ran, '%S+') do
    if id ~= '~' .. ARGV[2] then kept[#kept + 1] = id end
  end
  if #kept > 0 then
    redis.call('HSET', KEYS[3], 'ran', table.concat(kept, ' '))
  else
    redis.call('HDEL', KEYS[3], 'ran')
  end
end
if ARGV[1] == 'coalesce' and redis.pcall('LINDEX', KEYS[2], 0) == false then
  local r = redis.pcall('HMGET', KEYS[3], 'id', 'kind')
  if not r.err and r[1] and r[2] == 'coalesce' then  -- the handed-over run, not started
    local el = r[1] .. '\n' .. string.format('%.0f', now_ms) .. '\n' .. ARGV[3]
    redis.call('HSET', KEYS[3], 'el', el, 'new', '1')
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
    return {1, r[1], 1}
  end
end
--@include park_line.lua
