--[[
The token check a token-checked script starts with: is the value at the lease key this
holder's ("<token>:<fencing token>:<holder JSON>")? Code of the including script: an error
other than WRONGTYPE is its reply.

KEYS[1]  the lease key
ARGV[1]  the holder's token

Defines:
  cur   the value at KEYS[1] ('' for a key of another type), or false when it is absent
  mine  true when cur starts with ARGV[1] .. ':'
]]
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if not string.find(cur.err or '', 'WRONGTYPE', 1, true) then return cur end
  cur = ''
end
local mine = cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ':'
