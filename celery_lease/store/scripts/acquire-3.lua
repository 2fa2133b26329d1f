--[[
Take a lease for an execution whose message claimed the key's waiting slot at publish
(lease_dedupe): acquire-2.lua unchanged, then, when the lease is granted, the claim cleared in
the same script (includes/clear_claim.lua), so the execution makes no round trip more. A refused
grant keeps the claim: the copy goes on waiting (a retry or a successor is published again under
the same task id; a skip or a failure removes it with unclaim-1.lua).

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the claim key (<lease key>:waiting, same hash tag)

ARGV[1]  the token of the execution taking the lease (32 hex characters)
ARGV[2]  the lease's lifetime, int milliseconds (the TTL)
ARGV[3]  the holder JSON (task, task id, host, pid)
ARGV[4]  the fencing counter's lifetime, int milliseconds (the TTL plus an hour)
ARGV[5]  the execution's task id, as its message's claim names it

Returns what acquire-2.lua returns.
]]
local function acquire()
  --@include ../acquire-2.lua
end
local reply = acquire()
if reply[1] == 1 then
  --@include clear_claim.lua
end
return reply
