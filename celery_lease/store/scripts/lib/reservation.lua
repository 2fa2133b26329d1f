--[[
A hand-over's reservation of a free key (the hash handoff/release_handoff-4.lua writes: id,
due, el, kind, new; ran outlives it): whether an acquire may take the key, and the take.

Defines:
  reservation(key, task_id, handed_over, now_ms)  key: the reservation hash; task_id: the
      acquiring execution's; handed_over: true for a handed-over run; now_ms: the store's
      clock, ms (fractions kept). Returns ours (the key is reserved for task_id), joined (a
      later duplicate joined it: new), and the refusal when the key is not task_id's to take:
      {0, 'reserved:<id>', ms left} or {0, 'ran:<task_id>', 0}
  take_reservation(key, joined)  ends the reservation (its run starts); returns the message
      a joined duplicate left in el when joined, else false
]]
local function reservation(key, task_id, handed_over, now_ms)
  local r = redis.pcall('HMGET', key, 'id', 'due', 'ran', 'new')
  if r.err then r = {} end
  if r[1] == task_id then return true, r[4] == '1' end
  local ran = ' ' .. (r[3] or '') .. ' '  -- '~<id>': it retried; its retry parks first
  if handed_over and (string.find(ran, ' ' .. task_id .. ' ', 1, true)
                      or string.find(ran, ' ~' .. task_id .. ' ', 1, true)) then
    return false, false, {0, 'ran:' .. task_id, 0}
  end
  local left = r[1] and math.floor(tonumber(r[2] or '0') - now_ms) or 0
  if left > 0 then return false, false, {0, 'reserved:' .. r[1], left} end
  return false, false
end
local function take_reservation(key, joined)
  local message = joined and
    string.match(redis.call('HMGET', key, 'el')[1] or '', '^[^\n]*\n%d*\n(.*)$')
  redis.call('HDEL', key, 'id', 'due', 'el', 'kind', 'new')
  return message
end
