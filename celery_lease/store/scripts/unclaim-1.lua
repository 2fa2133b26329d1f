--[[
Remove the claim of a waiting copy whose message will not run (lease_dedupe): its publish failed,
it was revoked or expired at a worker, or it ended on a conflict without a copy sent on. Only
while the claim names that task id: a later copy's claim is left, and so is a key this library
did not write.

KEYS[1]  the claim key (<lease key>:waiting)

ARGV[1]  the task id of the message that will not run

Returns:
  1  removed
  0  no claim of that task id (absent, another copy's, or not a claim celery-lease writes)
]]
local claim = redis.pcall('GET', KEYS[1])
if type(claim) ~= 'string' then return 0 end
local ok, claimer = pcall(cjson.decode, string.match(claim, '^%d+:%d+:(.*)$') or '')
if ok and type(claimer) == 'table' and claimer.id == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
