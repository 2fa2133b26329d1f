--[[
The answer of a release whose token no longer holds the key: 1 when this token's own earlier
release already ended it, else 0. A release sent again after a broken connection (its first
reply may have been lost after the script ran) must not be taken for a loss. The counter names
this token as the last to end (':'), or as the last to end before the latest grant (';': a
waiting hold woken by that release may have been granted the key before the repeat arrived).
The token is random, so only its own earlier release wrote it there. A counter of another type
answers 0.

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
