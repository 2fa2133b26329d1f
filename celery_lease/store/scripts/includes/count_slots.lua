--[[
The held slots of a limited key (lease_limit=N): every field but "n" whose deadline (the
digits before its first ':', ms of the store's clock) is still ahead, a holder's slot and a
slot reserved for a handed-over run ("r:<task id>", until its lifetime ends) alike, but not a
tombstone ("<ms>:ran": see acquire_slot-3.lua); fields past their deadline are deleted on the
way. A field of another shape counts as held (an unknown holder). A key that is
no hash (a plain lease taken under lease_limit=1, another type) holds every slot.

KEYS[...]  none of its own: count_slots is handed the including script's lease key

Defines:
  count_slots(key, now_ms)  key: the lease key; now_ms: the store's clock, int ms.
                            Returns the number of held slots (math.huge for a key that is no
                            hash of slots).
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
