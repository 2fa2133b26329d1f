--[[
Park a duplicate that found its key held (lease_on_conflict "coalesce" or "queue") in the key's
line, unless the key is free by now (no holder, no reservation due): then nothing is written
and the caller tries the key again. "coalesce" keeps one element, the key's pending run: a
first duplicate adds it under a new task id, a later one replaces its message (the latest
arguments win) and its accepted time, keeping its task id. A "coalesce" duplicate that finds
the line empty and the key reserved for a coalesced run that has not started yet (kind
"coalesce", written by release_handoff-4.lua; the run's grant clears the reservation) joins
that run instead: it replaces the reserved element's message and accepted time and marks it
new, so the run's grant answers it (acquire-4.lua) and the run takes these arguments; a
reservation for a queued run is never joined. "queue" appends the duplicate, under its own
task id, unless the line already holds ARGV[4] elements or that task id (a second copy of one
message keeps the first one's place: it is handed the key once). A copy of a handed-over run
(ARGV[6]) whose task id already ran to its release is not parked (answered -2): its run is
done. The element is stamped with the store's clock (TIME), for the wait timeout. The line's
lifetime is set at every park.

KEYS[1]  the lease key
KEYS[2]  the line key (same hash tag)
KEYS[3]  the reservation hash key: id, due, el, kind, new (same hash tag)

ARGV[1]  "coalesce" or "queue"
ARGV[2]  the task id of a new element (coalesce: a fresh id; queue: the duplicate's own)
ARGV[3]  the message to keep (the signature, serialized by the caller)
ARGV[4]  the most elements the line may hold (queue)
ARGV[5]  the line's lifetime, int milliseconds
ARGV[6]  '1' for a copy of a handed-over run (queue: its own task id, ARGV[2]); absent: '0'

Returns:
  {1, id, length}  parked: id is the task id of the run that covers it, length the line's
                   (1 for a join of the reserved run)
  {0, 0}           the key is free: nothing written
  {-1, length}     the line is full (queue): nothing written
  {-2, 0}          a copy of a handed-over run that already ran to its release (its task id
                   is in the reservation's ran list, release_handoff-4.lua): nothing written
]]
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[6] == '1' then  -- a copy retried after store errors may come back after its run
  local ran = redis.pcall('HGET', KEYS[3], 'ran')
  if type(ran) == 'string'
      and string.find(' ' .. ran .. ' ', ' ' .. ARGV[2] .. ' ', 1, true) then
    return {-2, 0}
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local r = redis.pcall('HMGET', KEYS[3], 'id', 'due')
  if r.err or not r[1] or tonumber(r[2] or '0') <= now_ms then return {0, 0} end
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
