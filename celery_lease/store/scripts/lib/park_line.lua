--[[
Park a duplicate in the key's line, once the including script found the key held:
"coalesce" keeps one element, "queue" appends one per task id, up to ARGV[4]. Code of the
including script, which defines now_ms (clock_ms()) before: it returns.

KEYS[2]  the line key
ARGV[1]  "coalesce" or "queue"
ARGV[2]  the task id of a new element
ARGV[3]  the message to keep
ARGV[4]  the most elements the line may hold (queue)
ARGV[5]  the line's lifetime, int milliseconds

Returns (from the including script):
  {1, id, length}  parked: id is the task id of the run that covers it, length the line's
                   (queue: the position of the element already waiting under that task id)
  {-1, length}     the line is full (queue): nothing written
]]
local stamp = string.format('%.0f', now_ms)
if ARGV[1] == 'coalesce' then
  local head = redis.pcall('LINDEX', KEYS[2], 0)
  if type(head) == 'table' then return head end  -- a key of another type: the error
  if head then
    local id = string.match(head, '^([^\n]*)\n') or ARGV[2]
    redis.call('LSET', KEYS[2], 0, id .. '\n' .. stamp .. '\n' .. ARGV[3])
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
    return {1, id, 1}
  end
else
  -- A task id waits in a line once: a second copy of one parked message (redelivered, a
  -- debounce timer fired again, a retry of the park) would be handed the key a second time.
  local own = ARGV[2] .. '\n'
  local waiting = redis.pcall('LRANGE', KEYS[2], 0, -1)
  if waiting.err then return waiting end  -- a key of another type: the error
  for i, el in ipairs(waiting) do
    if string.sub(el, 1, #own) == own then return {1, ARGV[2], i} end
  end
  if #waiting >= tonumber(ARGV[4]) then return {-1, #waiting} end
end
local length = redis.call('RPUSH', KEYS[2], ARGV[2] .. '\n' .. stamp .. '\n' .. ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {1, ARGV[2], length}
