--[[
Decide one publish of a task with lease_dedupe: claim the key's waiting slot for the message
about to be published (SET PX, stamped with the store's clock), or name the copy already
waiting, onto which this publish folds. Nothing is written unless the message is published.

KEYS[1]  the claim key (<lease key>:waiting)
KEYS[2]  the lease key (same hash tag)

ARGV[1]  the task id of the message about to be published
ARGV[2]  the claim's lifetime, int milliseconds
ARGV[3]  the claimer JSON (task, task id, publishing host, pid)
ARGV[4]  '1' to take the claim over whoever holds it (a message the lease's holder publishes for
         its own key), '0' to claim only a free slot

Returns {claimed, answer, age}:
  {1, '', 0}          claimed for ARGV[1]: publish the message
  {0, task id, age}   a copy is waiting: its task id and its claim's age, int milliseconds;
                      publish nothing
  {2, what, 0}        the claim key holds what this library did not write (what says what):
                      publish without a claim
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include clock.lua
local now = clock_us()
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if not string.find(cur.err or '', 'WRONGTYPE', 1, true) then return cur end
  return {2, 'a key of another type', 0}
end
if cur and ARGV[4] ~= '1' then
  local ok, claimer = pcall(cjson.decode, string.match(cur, '^%d+:%d+:(.*)$') or '')
  local waiting = ok and type(claimer) == 'table' and claimer.id
  if type(waiting) ~= 'string' then return {2, 'not a claim celery-lease writes', 0} end
  if waiting ~= ARGV[1] then
    local lease = redis.pcall('GET', KEYS[2])
    local running = false
    if type(lease) == 'string' then
      local fine, holder = pcall(cjson.decode, string.match(lease, '^%x+:%d+:(.*)$') or '')
      running = fine and type(holder) == 'table' and holder.id == waiting
    end
    if not running then
      local at = tonumber(string.match(cur, '^(%d+):'))
      return {0, waiting, math.max(0, math.floor((now - at) / 1000))}
    end
  end
end
redis.call('SET', KEYS[1], string.format('%.0f', now) .. ':' .. ARGV[2] .. ':' .. ARGV[3],
           'PX', ARGV[2])
return {1, '', 0}
