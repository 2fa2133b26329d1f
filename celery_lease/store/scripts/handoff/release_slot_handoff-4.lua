--[[
Release one slot of a limited key (lease_limit=N, N > 1) and hand the freed slots over to the
runs waiting in the key's line, in one step: delete this token's field, note it as the last to
end, then reserve a slot ("r:<task id>") for the head of the line while fewer than N are held.

KEYS[1]  the lease key, a hash of slots
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the line key: a list of elements "<task id>\n<ms accepted>\n<message>" (same hash tag)
KEYS[4]  the N=1 reservation hash key: id, due, el (same hash tag)

ARGV[1]  the holder's token
ARGV[2]  how long a handed run has to take its slot before the sweep publishes it again (its
         due time), int milliseconds
ARGV[3]  the lifetime of the line and of a reservation, int milliseconds
ARGV[4]  the wait timeout of a line element, int milliseconds (0: none)
ARGV[5]  the releasing holder's task id when it is a handed-over run, else ''
ARGV[6]  the limit N, int >= 2

Returns:
  {1, now, count, handed..., expired...}  released now: now the store's clock (int ms), count
                                          the number of handed elements that follow, then the
                                          elements past their wait timeout
  {1, now, count, handed...}  a repeat whose earlier release's reservations are still untaken
  1  released by an earlier release of ARGV[1] (a repeat), nothing left to publish again
  0  ARGV[1] had no slot there (it expired, was revoked, or the key is of another type)
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now_ms = clock_ms()
local mark = ':' .. ARGV[1] .. ':'
if redis.pcall('HDEL', KEYS[1], ARGV[1]) ~= 1 then
  local function released_before()
    --@include released_before.lua
  end
  if released_before() == 0 then return 0 end
  -- A repeat: its first reply was lost, so what it handed over was never published; the
  -- reservations it made that no run has taken yet are answered again, for publishing.
  local again, fields = {1, now_ms, 0}, redis.pcall('HGETALL', KEYS[1])
  if fields.err then return 1 end
  for i = 1, #fields, 2 do
    local untl, rest = string.match(fields[i + 1], '^(%d+)(:.*)$')
    local el = rest and string.sub(rest, 1, #mark) == mark and
               string.match(string.sub(rest, #mark + 1), '^%d+:(.*)$')
    if string.sub(fields[i], 1, 2) == 'r:' and el and tonumber(untl) > now_ms then
      again[#again + 1] = el
      again[3] = again[3] + 1
    end
  end
  if again[3] == 0 then return 1 end
  return again
end
--@include note_ended.lua
if ARGV[5] ~= '' and redis.pcall('HGET', KEYS[4], 'id') == ARGV[5] then
  redis.pcall('HDEL', KEYS[4], 'id', 'el', 'due')
end
--@include count_slots.lua
local live = count_slots(KEYS[1], now_ms)
local handed, expired = {}, {}
local reserved = string.format('%.0f', now_ms + tonumber(ARGV[3])) .. mark ..
                 string.format('%.0f', now_ms + tonumber(ARGV[2])) .. ':'
--@include line_head.lua
while live < tonumber(ARGV[6]) do
  local el, id = line_head(KEYS[3], now_ms, tonumber(ARGV[4]), expired)
  if not el or type(redis.pcall('HSET', KEYS[1], 'r:' .. id, reserved .. el,
                                'n', ARGV[6])) == 'table' then
    break
  end
  handed[#handed + 1] = el
  redis.call('LPOP', KEYS[3])
  live = live + 1
end
if #handed > 0 then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  redis.pcall('PEXPIRE', KEYS[3], ARGV[3])
elseif redis.pcall('HLEN', KEYS[1]) == 1 and redis.pcall('HEXISTS', KEYS[1], 'n') == 1 then
  redis.call('DEL', KEYS[1])
end
local reply = {1, now_ms, #handed}
for _, el in ipairs(handed) do reply[#reply + 1] = el end
for _, el in ipairs(expired) do reply[#reply + 1] = el end
return reply
