--[[
A key's fencing counter: the next fencing token, max(counter + 1, now), and the counter's
write at a grant. A counter this library did not write refuses the grant.

Defines:
  next_fence(counter, now)  counter: the counter key; now: clock_us(). Returns the fencing
      token (digits) and the counter's value ('' when absent); or nil, nil and the reply
      refusing the grant ({0, '', the counter's pttl}, or the error of its GET)
  write_fence(counter, fence, last, lifetime)  writes fence to the counter with lifetime
      (int ms), the token of a release noted in last kept after ';'
]]
local function next_fence(counter, now)
  local last = redis.pcall('GET', counter)
  if type(last) == 'table' and not string.find(last.err or '', 'WRONGTYPE', 1, true) then
    return nil, nil, last
  end
  local n = not last and 0 or type(last) == 'string' and tonumber(string.match(last, '^%d+') or '')
  if not n or n >= 9007199254740991 then
    return nil, nil, {0, '', redis.call('PTTL', counter)}
  end
  return string.format('%.0f', math.max(n + 1, now)), last or ''
end
local function write_fence(counter, fence, last, lifetime)
  local ended = string.match(last, '^%d+:(.+)$')
  redis.call('SET', counter, ended and (fence .. ';' .. ended) or fence, 'PX', lifetime)
end
