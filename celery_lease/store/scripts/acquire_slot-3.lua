--[[
Take one of a key's N slots (lease_limit=N, N > 1): the key is a hash of individually leased
slots, one field per holder's token, never a counter. Each slot has its own deadline on the
server's clock (TIME, milliseconds), set here and by each renewal; a slot past its deadline is
no holder any more, whatever else happens, and this script deletes it before it counts. The
slots are counted, not a number kept beside them: nothing drifts after any number of crashes.
A repeat with the same token (its first reply was lost) finds its own slot and is granted again
with the same fencing token. The fencing token comes from the key's one counter
(includes/next_fence.lua), so it increases across every grant of every slot. HSET, the only
write refused under maxmemory, is the first write: a refused grant leaves nothing behind. The
hash's lifetime is set to its latest slot deadline in the same script (PEXPIRE), so no key is
ever left without one. A lower N than the slots held never evicts a holder: it refuses until
enough of them have ended. A slot a hand-over reserved (release_slot_handoff-4.lua: a field
"r:<task id>" holding "<until ms>:<releasing token>:<due ms>:<line element>") counts as held
until its lifetime ends (until), except by that task id, whose grant takes it (deletes the
field). One the crash sweep published again (its token emptied: two copies of that run may be
on their way) is not deleted but left as a tombstone "<until ms>:ran", which counts as no slot
and refuses that task id's other copy ('ran:<task id>'), so a double publish runs once. An execution whose message claimed the key's waiting slot at publish
(lease_dedupe) passes the claim key: its grant deletes the claim when it names this task id, in
the same script (the copy runs now: the next publish is queued again); a refusal keeps it.

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
         slot whose holder JSON has it is this task id's already (a message delivered again
         while its first delivery runs), so it is refused as held by that slot
ARGV[7]  the task id of the execution taking a slot ('' for none), for its claim (KEYS[3])
         and its reserved slot (r:<task id>)

A string at KEYS[1] (a plain lease, taken under lease_limit=1) holds the key: the slots start
once it ended. A key of another type, a field of another shape and a counter this library did
not write are held by an unknown holder: never overwritten, never deleted.

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
--@include next_fence.lua
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
local noted = string.match(last, '^%d+:(.+)$')
redis.call('SET', KEYS[2], noted and (fence .. ';' .. noted) or fence, 'PX', ARGV[4])
if KEYS[3] then  -- a claim of another task id, or not ours, stays
  local claim = redis.pcall('GET', KEYS[3])
  local ok, claimer = pcall(cjson.decode, type(claim) == 'string' and
                            string.match(claim, '^%d+:%d+:(.*)$') or '')
  if ok and type(claimer) == 'table' and claimer.id == ARGV[7] then redis.call('DEL', KEYS[3]) end
end
return {1, fence, tonumber(ARGV[2])}
