--[[
Decide one publish of a task with lease_debounce: start the key's burst (publish its timer),
or join the burst that is waiting. Each publish moves the due time to min(now + delay,
first + cap) and keeps its arguments as the latest; the clock is the store's.

KEYS[1]  the burst record (<lease key>:burst, same hash tag as the lease): a hash with id,
         first, due and until (int ms of the store's clock), msg (the latest arguments), by
         (the first publisher's JSON), n (publishes so far), fired (once it ran), timer (the
         id of the timer message that fired it), prev_id, prev_msg, prev_n, prev_timer (the
         fired burst this one replaced), ran (the last 20 bursts that ran, newest first)

ARGV[1]  the task id a new burst takes (the first publish's)
ARGV[2]  the quiet time, int milliseconds (lease_debounce)
ARGV[3]  the longest wait after the first publish, int milliseconds (lease_debounce_max)
ARGV[4]  this publish's arguments, serialized by the caller (JSON)
ARGV[5]  this publisher's JSON (task, task id, host, pid)
ARGV[6]  how long the record outlives first + cap, int milliseconds
ARGV[7]  how late past its due time a burst's timer counts as lost, int milliseconds

Returns {started, id, due_in, n}:
  {1, ARGV[1], ms, 1}  a new burst: publish its timer under ARGV[1], due in ms milliseconds
  {0, id, ms, n}       joined the waiting burst id (nothing to publish): due in ms (0 when
                       past due), n publishes so far
  {3, id, 0, n}        joined burst id, whose timer is more than ARGV[7] late: publish the
                       timer of id again
  {2, 'fired', 0, 0}   ARGV[1]'s own burst was run at once already (a tombstone): nothing
                       written
  {2, what, 0, 0}      the record key holds what this library did not write (what says
                       what): nothing written
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now = clock_ms()
local cur = redis.pcall('HMGET', KEYS[1], 'id', 'until', 'n', 'fired', 'due', 'msg', 'timer',
                        'ran')
if cur.err then
  if not string.find(cur.err, 'WRONGTYPE', 1, true) then return cur end
  return {2, 'a key of another type', 0, 0}
end
local fmt = function(ms) return string.format('%.0f', ms) end
local prev = false
if cur[4] then
  if cur[1] == ARGV[1] then return {2, 'fired', 0, 0} end
  if cur[1] then  -- a tombstone of a publish run at once has no msg: it ran as published
    -- The bursts that ran, newest first, the last 20, each with the timer that fired it
    -- (<task id>/<timer id>): that timer again, its fire's reply lost, still runs.
    local ran = {cur[1] .. '/' .. (cur[7] or '')}
    for id in string.gmatch(cur[8] or '', '%S+') do
      if #ran >= 20 then break end
      if id ~= cur[1] and string.sub(id, 1, #cur[1] + 1) ~= cur[1] .. '/' then
        ran[#ran + 1] = id
      end
    end
    prev = {'prev_id', cur[1], 'prev_timer', cur[7] or '', 'ran', table.concat(ran, ' ')}
    if cur[6] then
      table.insert(prev, 'prev_msg'); table.insert(prev, cur[6])
      table.insert(prev, 'prev_n'); table.insert(prev, cur[3] or 1)
    end
  end
  redis.call('DEL', KEYS[1])  -- a fired burst, or a tombstone of another publish: afresh
elseif cur[1] then
  local deadline = tonumber(cur[2] or '')
  if not deadline then return {2, 'not a burst record celery-lease writes', 0, 0} end
  local late = (tonumber(cur[5] or '') or now) + tonumber(ARGV[7]) < now
  local due = math.min(now + tonumber(ARGV[2]), deadline)
  local n = (tonumber(cur[3] or '0') or 0) + 1
  redis.call('HSET', KEYS[1], 'due', fmt(due), 'msg', ARGV[4], 'n', n)
  redis.call('PEXPIRE', KEYS[1], fmt(math.max(deadline - now, 0) + tonumber(ARGV[6])))
  if late then return {3, cur[1], 0, n} end
  return {0, cur[1], math.max(due - now, 0), n}
end
if not cur[4] and redis.call('EXISTS', KEYS[1]) == 1 then
  return {2, 'not a burst record celery-lease writes', 0, 0}
end
local deadline = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'first', fmt(now), 'due',
           fmt(now + tonumber(ARGV[2])), 'until', fmt(deadline), 'msg', ARGV[4], 'by', ARGV[5],
           'n', 1)
if prev then redis.call('HSET', KEYS[1], unpack(prev)) end
redis.call('PEXPIRE', KEYS[1], fmt(tonumber(ARGV[3]) + tonumber(ARGV[6])))
return {1, ARGV[1], tonumber(ARGV[2]), 1}
