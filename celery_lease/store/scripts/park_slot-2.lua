--[[
Park a duplicate in a limited key's line (lease_limit=N, N > 1; lease_on_conflict "coalesce",
"queue", or "retry", which waits as "queue" does) when all N slots are held, in one step with
that check: the slots are counted here (includes/count_slots.lua: a reserved slot counts as
held), so a slot freed since the duplicate's refused acquire is taken instead (nothing written)
and no duplicate waits beside a free slot. The park is park-3.lua's (includes/park_line.lua):
coalesce keeps at most one pending run per key, queue appends up to a bound, each task id
once.

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
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
--@include count_slots.lua
if count_slots(KEYS[1], now_ms) < tonumber(ARGV[6]) then return {0, 0} end
--@include park_line.lua
