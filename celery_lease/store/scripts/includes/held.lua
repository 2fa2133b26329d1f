--[[
The token check every token-checked script starts with: is the value at the lease key this
holder's? A value is "<token>:<fencing token>:<holder JSON>"; it is this holder's when it
starts with "<token>:".

KEYS[1]  the lease key
ARGV[1]  the holder's token (32 hex characters)

Defines:
  cur   the value at KEYS[1], or false when the key is absent
  mine  true when cur starts with ARGV[1] .. ':'
]]
local cur = redis.call('GET', KEYS[1])
local mine = cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ':'
