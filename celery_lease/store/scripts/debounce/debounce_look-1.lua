--[[
The crash sweep's look at a key's debounce burst: a burst still waiting past its due time
plus ARGV[1] lost its timer; answer its task id and latest arguments, for the sweep to
publish its timer again. Nothing is written.

KEYS[1]  the burst record (<lease key>:burst, see debounce/debounce-1.lua)

ARGV[1]  how late past its due time a timer may be before it counts as lost, int milliseconds

Returns:
  {0, '', '', 0}     no burst waits (none, a fired one, or not a burst record): nothing to
                     look at
  {1, '', '', ms}    a burst waits, its timer not late yet: look again in ms milliseconds
  {2, id, msg, ms}   late: publish the timer of burst id again (msg its latest arguments);
                     look again in ms milliseconds
]]
--@include clock.lua
local now = clock_ms()
local cur = redis.pcall('HMGET', KEYS[1], 'id', 'due', 'msg', 'fired')
if cur.err or not cur[1] or not cur[3] or cur[4] then return {0, '', '', 0} end
local late = (tonumber(cur[2] or '0') or 0) + tonumber(ARGV[1])
if late > now then return {1, '', '', late - now} end
return {2, cur[1], cur[3], tonumber(ARGV[1])}
