--[[
A waiting copy's claim (dedupe/claim-2.lua): deleted when it names the given task id; a
claim of another task id, and a key this library did not write, are left alone.

Defines:
  clear_claim(key, task_id)  key: the claim key (<lease key>:waiting). Returns 1 when the
      claim was task_id's and is deleted, else 0
]]
local function clear_claim(key, task_id)
  local claim = redis.pcall('GET', key)
  local ok, claimer = pcall(cjson.decode, type(claim) == 'string' and
                            string.match(claim, '^%d+:%d+:(.*)$') or '')
  if ok and type(claimer) == 'table' and claimer.id == task_id then
    return redis.call('DEL', key)
  end
  return 0
end
