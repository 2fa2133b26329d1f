--[[
Decide what a debounce timer message does when a worker receives it (lease_debounce): a timer
of a burst that is no longer waiting (it ran, or another burst replaced it) does nothing; one
that arrives before the burst's due time (later publishes moved it) is told how long is left,
to publish itself again for the remainder under the same task id; one at or past the due time
fires the burst: the record is deleted, in the same script, and its latest arguments answered
for the run. So of two timers of one burst (a timer published again by the crash sweep) only
the first fires. The due time is compared with the store's clock (TIME).

KEYS[1]  the burst record (<lease key>:burst, see debounce-1.lua)

ARGV[1]  the timer's task id

Returns:
  {0, '', 0, 0}           no burst of ARGV[1] waits: do nothing
  {1, '', ms, 0}          early: the burst is due in ms milliseconds
  {2, msg, n, waited}     fire: msg the latest arguments, n the publishes folded into the
                          run, waited int ms since the burst's first publish
]]
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.pcall('HMGET', KEYS[1], 'id', 'due', 'msg', 'n', 'first')
if cur.err or cur[1] ~= ARGV[1] or not cur[3] then return {0, '', 0, 0} end
local due = tonumber(cur[2] or '0') or 0
if due > now then return {1, '', due - now, 0} end
redis.call('DEL', KEYS[1])
return {2, cur[3], tonumber(cur[4] or '1') or 1,
        math.max(now - (tonumber(cur[5] or '') or now), 0)}
