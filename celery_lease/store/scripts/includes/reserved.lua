--[[
The reservation check of an acquire that found the lease key free: a release that handed the
key over (release_handoff-4.lua) reserved it for one task id until a due time (the store's
clock, milliseconds). While the reservation is due, another task id finds the key held by it.
A reservation past its due time no longer holds the key (its run is published again by the
crash sweep). A handed-over run whose task id already ran to its release (noted by that
release: its message was published twice) is refused, so a double publish runs once; one
that started and died did not release, and runs again. A reservation key of another type is
not ours and is ignored.

KEYS[3]  the reservation hash key: id, due (ms of the store's clock), el (the line element),
         kind, new ('1': a later duplicate joined the reserved run: el holds its message,
         park-3.lua), ran (the task ids of the last handed-over runs that released the
         key, newest first, space separated: release_handoff-4.lua)
ARGV[5]  the task id of the execution taking the lease
ARGV[6]  '1' for a handed-over run

Uses now (microseconds of TIME), defined before the include.

Defines:
  reserved_for  the task id the key is reserved for, or false
  joined        the reserved run takes the key and a later duplicate joined it (new)

Returns (from the including script), when the key is not this execution's to take:
  {0, 'reserved:<id>', ms}  reserved for another task id for ms milliseconds more
  {0, 'ran:<id>', 0}        this handed-over run already ran to its release
]]
local reservation = redis.pcall('HMGET', KEYS[3], 'id', 'due', 'ran', 'new')
if reservation.err then reservation = {} end
local reserved_for = reservation[1] or false
local joined = reserved_for == ARGV[5] and reservation[4] == '1'
if ARGV[6] == '1' and reserved_for ~= ARGV[5]
    and string.find(' ' .. (reservation[3] or '') .. ' ', ' ' .. ARGV[5] .. ' ', 1, true) then
  return {0, 'ran:' .. ARGV[5], 0}
end
if reserved_for and reserved_for ~= ARGV[5] then
  local left = math.floor(tonumber(reservation[2] or '0') - now / 1000)
  if left > 0 then return {0, 'reserved:' .. reserved_for, left} end
end
