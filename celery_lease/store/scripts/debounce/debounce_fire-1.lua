--[[
Decide what a debounce timer message does on a worker: nothing for a burst no longer waiting,
the time left for one not due yet, else fire the burst (marked fired, a tombstone, in the same
step) and answer its latest arguments. A timer that finds no trace of its burst runs as published.

KEYS[1]  the burst record (<lease key>:burst, see debounce/debounce-1.lua)

ARGV[1]  the timer's task id
ARGV[2]  '1' for a message that was published to run at once (its publish could not ask the
         store): it fires its own burst whatever the due time; else '0'
ARGV[3]  the tombstone's lifetime, int milliseconds
ARGV[4]  '1' for the same timer again (redelivered, or retried after a store error)
ARGV[5]  the timer message's own id (its lease_debounce_timer header; '' for a message
         published without one)

Returns:
  {0, '', 0, 0}           no burst of ARGV[1] waits (a tombstone of it, or a newer burst's
                          record that names it: prev_id, ran): do nothing
  {1, '', ms, 0}          early: the burst is due in ms milliseconds
  {2, msg, n, waited}     fire: msg the latest arguments, n the publishes folded into the
                          run, waited int ms since the burst's first publish
  {3, '', 0, 0}           no record at all, or another burst's record with no trace of
                          this one: run as published
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now = clock_ms()
local cur = redis.pcall('HMGET', KEYS[1], 'id', 'due', 'msg', 'n', 'first', 'fired',
                        'prev_id', 'prev_msg', 'prev_n', 'timer', 'prev_timer', 'ran')
local own = ARGV[5] or ''
if cur.err then return {ARGV[2] == '1' and 3 or 0, '', 0, 0} end
local function fired()
  return {2, cur[3], tonumber(cur[4] or '1') or 1,
          math.max(now - (tonumber(cur[5] or '') or now), 0)}
end
if not cur[1] then
  if redis.call('EXISTS', KEYS[1]) == 1 then  -- not ours
    return {ARGV[2] == '1' and 3 or 0, '', 0, 0}
  end
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'fired', 1, 'timer', own)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {3, '', 0, 0}
end
if cur[1] ~= ARGV[1] then
  if cur[7] == ARGV[1] then  -- ARGV[1]'s burst fired, and a newer burst replaced it
    if ARGV[4] == '1' and (cur[11] or '') == own then  -- the timer that fired it: lost reply
      if cur[8] then return {2, cur[8], tonumber(cur[9] or '1') or 1, 0} end
      return {3, '', 0, 0}  -- it had found no record: it runs as published again
    end
    return {0, '', 0, 0}  -- a message published at once too: its burst ran
  end
  local ran = ' ' .. (cur[12] or '') .. ' '
  if string.find(ran, ' ' .. ARGV[1] .. '/' .. own .. ' ', 1, true) and ARGV[4] == '1' then
    return {3, '', 0, 0}  -- it ran as published below, its reply lost: it runs again
  end
  if string.find(ran, ' ' .. ARGV[1] .. ' ', 1, true)
      or string.find(ran, ' ' .. ARGV[1] .. '/', 1, true) then
    return {0, '', 0, 0}  -- it ran, and newer bursts replaced it since
  end
  -- A burst this record has no trace of: its record was lost (a failover, an emptied store)
  -- or, for a message published at once, its trigger joined this burst or never landed. It
  -- runs as published, noted here (with its timer id, for itself again) so that other copies
  -- of it do nothing.
  local ran = {ARGV[1] .. '/' .. own}
  for id in string.gmatch(cur[12] or '', '%S+') do
    if #ran >= 20 then break end
    ran[#ran + 1] = id
  end
  redis.call('HSET', KEYS[1], 'ran', table.concat(ran, ' '))
  return {3, '', 0, 0}
end
if cur[6] then  -- fired already: only the same timer again fires it again
  if ARGV[4] == '1' and (cur[10] or '') == own then
    if cur[3] then return fired() end
    return {3, '', 0, 0}  -- it had found no record: it runs as published again
  end
  return {0, '', 0, 0}
end
if not cur[3] then return {0, '', 0, 0} end
local due = tonumber(cur[2] or '0') or 0
if due > now and ARGV[2] ~= '1' then return {1, '', due - now, 0} end
redis.call('HSET', KEYS[1], 'fired', 1, 'timer', own)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return fired()
