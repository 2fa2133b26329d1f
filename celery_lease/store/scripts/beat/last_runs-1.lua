--[[
Read beat's last-run record together with the store's clock, in one step on the node that
holds it, so that the reader turns each stamp into an age on that one clock.

KEYS[1]  the last-run hash (<beat leader key>:last-run)

Returns {seconds, microseconds, fields}:
  seconds, microseconds  the server's clock (TIME) now
  fields                 the hash as a flat list: entry name, stamp, entry name, stamp...
                         (empty when the record is absent, or a key of another type that
                         beat did not write)
]]
local t = redis.call('TIME')
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return {t[1], t[2], {}} end
return {t[1], t[2], redis.call('HGETALL', KEYS[1])}
