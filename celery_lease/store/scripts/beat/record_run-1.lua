--[[
Record that the beat leader sent a schedule entry, stamped with the store's clock (TIME), not
the sender's. The record's lifetime is raised to ARGV[2] when it has less left.

KEYS[1]  the last-run hash (<beat leader key>:last-run): entry name -> the server time of its
         last send, "<seconds>.<microseconds>"

ARGV[1]  the entry's name
ARGV[2]  the record's lifetime, int milliseconds

Returns:
  the stamp written, "<seconds>.<microseconds>" of the server's clock
]]
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local stamp = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('HSET', KEYS[1], ARGV[1], stamp)
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return stamp
