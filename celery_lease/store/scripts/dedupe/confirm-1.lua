--[[
Give a waiting copy's claim its full lifetime once its message is published (lease_dedupe),
only while the claim names that task id. A claim is written with a provisional lifetime
(dedupe/claim-2.lua, at most lease_ttl), so one whose publisher died before its publish
lapses soon; a claim the grant already cleared, or that lapsed, is never written again.

KEYS[1]  the claim key (<lease key>:waiting)

ARGV[1]  the task id of the message just published
ARGV[2]  the claim's full lifetime, int milliseconds, counted from when it was claimed

Returns:
  1  the claim now lives until its claim time plus ARGV[2]
  0  no claim of that task id (cleared by its grant, removed, lapsed, or another copy's)
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' then return 0 end
local at, meta = string.match(cur, '^(%d+):%d+:(.*)$')
local ok, claimer = pcall(cjson.decode, meta or '')
if not (ok and type(claimer) == 'table' and claimer.id == ARGV[1]) then return 0 end
local left = math.floor(tonumber(ARGV[2]) - (clock_us() - tonumber(at)) / 1000)
if left < 1 then return 0 end  -- its full lifetime is already over: the provisional one ends it
redis.call('SET', KEYS[1], at .. ':' .. ARGV[2] .. ':' .. meta, 'PX', left)
return 1
