--[[
The next fencing token of a key (acquire-4.lua, preempt-4.lua): max(counter + 1, server time in
microseconds), refused for a counter this library did not write (another type, a value that
does not start with digits, digits at or above 2^53 - 1).

KEYS[2]  the fencing counter key

Defines:
  now      the server's time, microseconds (TIME)
  fence    the next fencing token (a string of digits), or nil when the counter is not ours
  last     the counter's stored value ('' when absent)
  refusal  when fence is nil: the reply to give ({0, '', pttl of the counter}, or its error)
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.pcall('GET', KEYS[2])
local fence, refusal = nil, nil
if type(last) == 'table' and not string.find(last.err or '', 'WRONGTYPE', 1, true) then
  refusal = last
else
  local counter = 0
  if last then
    counter = type(last) == 'string' and tonumber(string.match(last, '^%d+') or '')
  else
    last = ''
  end
  if not counter or counter >= 9007199254740991 then
    refusal = {0, '', redis.call('PTTL', KEYS[2])}
  else
    fence = counter + 1
    if now > fence then fence = now end
    fence = string.format('%.0f', fence)
  end
end
