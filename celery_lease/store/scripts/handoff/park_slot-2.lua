--[[
Park a duplicate in a limited key's line (lease_limit=N, N > 1; "coalesce", "queue", or
"retry", which waits as "queue" does) when all N slots are held, counted in the same step:
a slot freed meanwhile is taken instead. The park is handoff/park-3.lua's.

KEYS[1]  the lease key, a hash of slots
KEYS[2]  the line key (same hash tag)

ARGV[1]  "coalesce" or "queue"
ARGV[2]  the task id of a new element (coalesce: a fresh id; queue: the duplicate's own)
ARGV[3]  the message to keep (the signature, serialized by the caller)
ARGV[4]  the most elements the line may hold (queue)
ARGV[5]  the line's lifetime, int milliseconds
ARGV[6]  the limit N, int >= 2

Returns:
  {1, id, length}  parked: id is the task id of the run that covers it, length the line's
  {0, 0}           a slot is free: nothing written (expired slots deleted)
  {-1, length}     the line is full (queue): nothing written
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now_ms = clock_ms()
--@include count_slots.lua
if count_slots(KEYS[1], now_ms) < tonumber(ARGV[6]) then return {0, 0} end
--@include park_line.lua
