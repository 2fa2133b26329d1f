--[[
The store's clock (TIME), the one clock every host reads alike: used for anything another
host compares (deadlines, due times, stamps, fencing tokens).

Defines:
  clock_us()  the server's time, int microseconds
  clock_ms()  the server's time, int milliseconds (clock_us() rounded down)
]]
local function clock_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function clock_ms() return math.floor(clock_us() / 1000) end
