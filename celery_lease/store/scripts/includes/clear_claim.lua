--[[
Clear the claim of the key's waiting copy (lease_dedupe) when it names the execution just granted
the lease: that copy runs now, so the next publish is queued again (at most one running and one
waiting). A claim naming another task id (a copy published after this one) is left, and so is a
key this library did not write.

KEYS[3]  the claim key (<lease key>:waiting, same hash tag)
ARGV[5]  the granted execution's task id
]]
local claim = redis.pcall('GET', KEYS[3])
if type(claim) == 'string' then
  local ok, claimer = pcall(cjson.decode, string.match(claim, '^%d+:%d+:(.*)$') or '')
  if ok and type(claimer) == 'table' and claimer.id == ARGV[5] then
    redis.call('DEL', KEYS[3])
  end
end
