--[[
Park a duplicate that found its key held (lease_on_conflict "coalesce" or "queue") in the key's
line, unless the key is free by now (no holder, no reservation due): then nothing is written
and the caller tries the key again. "coalesce" keeps one element, the key's pending run: a
first duplicate adds it under a new task id, a later one replaces its message (the latest
arguments win) and its accepted time, keeping its task id. "queue" appends the duplicate, under
its own task id, unless the line already holds ARGV[4] elements. The element is stamped with
the store's clock (TIME), for the wait timeout. The line's lifetime is set at every park.

KEYS[1]  the lease key
KEYS[2]  the line key (same hash tag)
KEYS[3]  the reservation hash key (same hash tag)

ARGV[1]  "coalesce" or "queue"
ARGV[2]  the task id of a new element (coalesce: a fresh id; queue: the duplicate's own)
ARGV[3]  the message to keep (the signature, serialized by the caller)
ARGV[4]  the most elements the line may hold (queue)
ARGV[5]  the line's lifetime, int milliseconds

Returns:
  {1, id, length}  parked: id is the task id of the run that covers it, length the line's
  {0, 0}           the key is free: nothing written
  {-1, length}     the line is full (queue): nothing written
]]
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  local r = redis.pcall('HMGET', KEYS[3], 'id', 'due')
  if r.err or not r[1] or tonumber(r[2] or '0') <= now_ms then return {0, 0} end
end
--@include park_line.lua
