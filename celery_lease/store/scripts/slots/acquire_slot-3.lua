--[[
Take one of a key's N slots (lease_limit=N, N > 1): the key is a hash, one field per holder's
token with its own deadline on the store's clock. Expired slots are deleted first; a repeat
with the same token is granted again; a hand-over's reserved slot is its task id's to take.

Stored at KEYS[1] (a hash):
  <token>  "<deadline, ms of the store's clock>:<fencing token>:<holder JSON>"
  n        the N of the last grant (for celery lease ls: used/N)
  r:<id>   a slot reserved for handed-over run <id>: "<until, ms>:<token>:<due, ms>:<line
           element>", or "<until, ms>:ran" once a copy the sweep published again took it

KEYS[1]  the lease key, a hash of slots
KEYS[2]  the key's one fencing counter, under the same hash tag
KEYS[3]  given for a message that claimed the waiting slot at publish: <lease key>:waiting

ARGV[1]  this execution's token (32 hex characters): its slot's field
ARGV[2]  the TTL: the slot's deadline is the store's clock plus this many milliseconds
ARGV[3]  who takes the slot: the holder JSON (task, task id, host, pid)
ARGV[4]  how long the fencing counter lives, milliseconds: the TTL and an hour
ARGV[5]  the limit N, int >= 2
ARGV[6]  ',"id":<task id as JSON>,' of the execution taking a slot, or '' (a hold): a live
         slot whose holder JSON has it is this task id's already (refused as held by it)
ARGV[7]  the task id of the execution taking a slot ('' for none), for its claim (KEYS[3])
         and its reserved slot (r:<task id>)

Returns {granted, answer, pttl}:
  {1, fence, ARGV[2]}  granted now; answer is the fencing token alone (digits)
  {1, value, pttl}     this token holds a slot already (a repeat); value is
                       "<token>:<fencing token>:<holder JSON>", pttl its slot's time left
  {0, value, pttl}     all N slots held; value names the holder whose slot ends first
                       ("<token>:<fencing token>:<holder JSON>"), pttl its time left, int ms
                       ('' and the time to the soonest reservation's due time, or one TTL
                       for one past it, when all are reserved)
  {0, value, pttl}     a live slot of the same task id (ARGV[6]): its value and time left
  {0, value, pttl}     a plain lease at KEYS[1]: its value and lifetime left
  {0, '', pttl}        a key of another type, or a counter not ours (pttl: that key's)
  {0, 'ran:<id>', 0}   a copy of handed-over run ARGV[7] already took its slot (a tombstone)
]]
if redis.replicate_commands then redis.replicate_commands() end
local slots = redis.pcall('HGETALL', KEYS[1])
if slots.err then
  if not string.find(slots.err, 'WRONGTYPE', 1, true) then return slots end
  local plain = redis.pcall('GET', KEYS[1])
  return {0, type(plain) == 'string' and plain or '', redis.call('PTTL', KEYS[1])}
end
--@include clock.lua
--@include fence.lua
local now = clock_us()
local fence, last, refusal = next_fence(KEYS[2], now)
local now_ms = math.floor(now / 1000)
local live, ended, first, first_at, latest = 0, {}, nil, nil, now_ms
local same, reserved_at, own, swept = nil, nil, nil, nil
for i = 1, #slots, 2 do
  local field, slot = slots[i], slots[i + 1]
  if string.sub(field, 1, 2) == 'r:' then  -- a slot reserved for a handed-over run
    local due = tonumber(string.match(slot, '^(%d+):') or '')
    local mine = ARGV[7] ~= '' and field == 'r:' .. ARGV[7]
    if not due or due <= now_ms then
      ended[#ended + 1] = field
    elseif string.find(slot, '^%d+:ran$') then  -- a tombstone: no slot
      if mine then return {0, 'ran:' .. ARGV[7], 0} end
    elseif mine then
      own = field  -- this run's own: taken by its grant (deleted), not counted
      if string.find(slot, '^%d+::') then swept = due end
    else
      live = live + 1
      if due > latest then latest = due end
      -- held until its run takes it: expected by its due time (one TTL past it, when the
      -- sweep publishes it again), not its lifetime
      local soon = tonumber(string.match(slot, '^%d+:[^:]*:(%d+):') or '') or due
      if soon <= now_ms then soon = now_ms + tonumber(ARGV[2]) end
      if soon > due then soon = due end
      if not reserved_at or soon < reserved_at then reserved_at = soon end
    end
  elseif field ~= 'n' then
    local due, rest = string.match(slot, '^(%d+):(%d+:.*)$')
    due = tonumber(due)
    if not due then
      live = live + 1  -- not a slot this library wrote: held, by an unknown holder
      if not first then first, first_at = '', now_ms end
    elseif due <= now_ms then
      ended[#ended + 1] = field
    elseif field == ARGV[1] then
      return {1, field .. ':' .. rest, due - now_ms}
    else
      live = live + 1
      if ARGV[6] ~= '' and string.find(slot, ARGV[6], 1, true) then
        same = {0, field .. ':' .. rest, due - now_ms}
      end
      if due > latest then latest = due end
      if not first_at or due < first_at then first, first_at = field .. ':' .. rest, due end
    end
  end
end
if same then return same end
if live >= tonumber(ARGV[5]) then
  if #ended > 0 then redis.call('HDEL', KEYS[1], unpack(ended)) end
  if not first then first, first_at = '', reserved_at end  -- reserved slots only
  return {0, first, first_at - now_ms}
end
if not fence then return refusal end
local deadline = now_ms + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], deadline .. ':' .. fence .. ':' .. ARGV[3], 'n', ARGV[5])
if swept then
  redis.call('HSET', KEYS[1], own, string.format('%.0f', swept) .. ':ran')
  if swept > latest then latest = swept end
elseif own then
  ended[#ended + 1] = own
end
if #ended > 0 then redis.call('HDEL', KEYS[1], unpack(ended)) end
if deadline > latest then latest = deadline end
redis.call('PEXPIRE', KEYS[1], latest - now_ms)
write_fence(KEYS[2], fence, last, ARGV[4])
if KEYS[3] then
  --@include claim.lua
  clear_claim(KEYS[3], ARGV[7])
end
return {1, fence, tonumber(ARGV[2])}
