--[[
Count the held slots of a limited key (a hash of slots): holders' slots and reservations
still ahead of their deadline; fields past it are deleted on the way.

Defines:
  count_slots(key, now_ms)  key: the lease key; now_ms: clock_ms(). Returns the number of
      held slots (math.huge for a key that is no hash)
]]
local function count_slots(key, now_ms)
  local fields = redis.pcall('HGETALL', key)
  if fields.err then return math.huge end
  local live, ended = 0, {}
  for i = 1, #fields, 2 do
    local field = fields[i]
    if field ~= 'n' and not string.find(fields[i + 1], '^%d+:ran$') then
      local due = tonumber(string.match(fields[i + 1], '^(%d+):') or '')
      if due and due <= now_ms then
        ended[#ended + 1] = field
      else
        live = live + 1
      end
    end
  end
  if #ended > 0 then redis.call('HDEL', key, unpack(ended)) end
  return live
end
