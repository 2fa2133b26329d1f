--[[
Remove the claim of a waiting copy whose message will not run (lease_dedupe), only while the
claim names that task id.

KEYS[1]  the claim key (<lease key>:waiting)

ARGV[1]  the task id of the message that will not run

Returns:
  1  removed
  0  no claim of that task id (absent, another copy's, or not a claim celery-lease writes)
]]
--@include claim.lua
return clear_claim(KEYS[1], ARGV[1])
