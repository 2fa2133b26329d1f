--[[
The reply of a release whose token no longer holds the key: was the key ended by this
token's own earlier release (its reply lost)? Code of the including script: it returns.

KEYS[2]  the fencing counter key
ARGV[1]  the releasing holder's token

Returns (from the including script):
  1  ARGV[1] released the key before
  0  it did not: the key was lost
]]
local last = redis.pcall('GET', KEYS[2])
local tail = type(last) == 'string' and string.sub(last, -#ARGV[1] - 1)
if tail == ':' .. ARGV[1] or tail == ';' .. ARGV[1] then return 1 end
return 0
