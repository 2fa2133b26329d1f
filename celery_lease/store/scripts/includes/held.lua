--[[
The token check every token-checked script starts with: is the value at the lease key this
holder's? A value is "<token>:<fencing token>:<holder JSON>"; it is this holder's when it
starts with "<token>:".

KEYS[1]  the lease key
ARGV[1]  the holder's token (32 hex characters)

A key of another type (WRONGTYPE: a hash, a list) is no lease of ours but holds the key all
the same: cur is '' for it (held by an unknown holder), so no script errors on it, overwrites it
or deletes it. Any other error (an ACL refusal) is the script's reply.

Defines:
  cur   the value at KEYS[1] ('' for a key of another type), or false when the key is absent
  mine  true when cur starts with ARGV[1] .. ':'
]]
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if not string.find(cur.err or '', 'WRONGTYPE', 1, true) then return cur end
  cur = ''
end
local mine = cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ':'
