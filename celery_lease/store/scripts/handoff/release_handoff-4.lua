--[[
Hand a lease key over to the next run waiting in its line (lease_on_conflict "coalesce" or
"queue"), in one step with what frees the key: the holder's release, or the crash sweep's
look at a key nobody holds. The key is reserved for that run, whose element is answered.

KEYS[1]  the lease key
KEYS[2]  the fencing counter key (same hash tag)
KEYS[3]  the line key: a list of elements "<task id>\n<ms accepted>\n<message>" (same hash tag)
KEYS[4]  the reservation hash key: id, due (ms of the store's clock), el, kind, new (a later
         duplicate joined: handoff/park-3.lua), ran (see ARGV[5]) (same hash tag)

ARGV[1]  the holder's token; empty for the crash sweep's look
ARGV[2]  how long the reservation holds the key, int milliseconds
ARGV[3]  the lifetime of the line and the reservation, int milliseconds
ARGV[4]  the wait timeout of a line element, int milliseconds (0: none)
ARGV[5]  the releasing holder's task id when it is a handed-over run or its run ended for
         good, else '': noted in the reservation's ran field (the last 20, newest first,
         space separated; '~<id>' for a handed-over run that retried) for a handed-over
         run, or when a line or a reservation hash is there; a run that ended for good also
         takes its own element still waiting in the line out (a copy of a waiting run that
         took the key while the element waited)
ARGV[6]  the line's policy, the kind noted in a new reservation: "coalesce" or "queue"
         (absent: "queue", as a caller that predates it means)
ARGV[7]  how the run of ARGV[5] ended: '0' for good, '1' for good and handed over, '2'
         handed over and retried (its retry parks under the same task id: nothing is taken
         out, and it is noted '~<id>': handoff/park-3.lua takes that note out when its
         retry parks). Absent: as '2' (a handed-over run, however it ended), as a caller
         that predates it means

Returns:
  {1, element, now, expired...}  released now (or, for the sweep, free): element is the run
                                 handed the key ('' for none), now the store's clock (int
                                 ms), expired the line elements past their wait timeout
  {0, ms}  the sweep's look: held, or reserved and due, for ms more milliseconds
  {2, ms, element...}  the sweep's look at a limited key: the runs of its slot reservations
                       past due, to publish again; look again in ms milliseconds
  1        released by an earlier release of ARGV[1] (a repeat)
  0        ARGV[1] did not hold the key
]]
if redis.replicate_commands then redis.replicate_commands() end
--@include held.lua
--@include clock.lua
local now_ms = clock_ms()
if ARGV[1] == '' then
  local reservation = redis.pcall('HMGET', KEYS[4], 'id', 'due')
  if reservation.err then reservation = {} end
  local wait = false
  local again = {}
  local function sooner(ms)
    if not wait or ms < wait then wait = ms end
  end
  if cur then
    local pttl = redis.call('PTTL', KEYS[1])
    pttl = pttl > 0 and pttl or tonumber(ARGV[2])
    local fields = cur == '' and redis.pcall('HGETALL', KEYS[1]) or {}
    if fields.err or #fields == 0 then sooner(pttl) fields = {} end  -- a lease, another type
    for i = 1, #fields, 2 do  -- a hash: held while a slot or a reservation lives
      local field, value = fields[i], fields[i + 1]
      local untl, due, el = string.match(value, '^(%d+):[^:]*:(%d+):(.*)$')
      if string.sub(field, 1, 2) == 'r:' then
        if el and tonumber(untl) > now_ms then
          due = tonumber(due)
          if due <= now_ms then  -- its publish was lost: publish it again
            due = now_ms + tonumber(ARGV[2])
            if type(redis.pcall('HSET', KEYS[1], field, untl .. '::' ..
                                string.format('%.0f', due) .. ':' .. el)) ~= 'table' then
              again[#again + 1] = el
            end
          end
          sooner(due - now_ms)
        end  -- a tombstone ("<ms>:ran") or one past its lifetime holds nothing
      elseif field ~= 'n' then
        local deadline = tonumber(string.match(value, '^(%d+):%d+:') or '')
        if not deadline then
          sooner(pttl)  -- not a slot this library wrote: held, by an unknown holder
        elseif deadline > now_ms then
          sooner(deadline - now_ms)
        end
      end
    end
  end
  if not wait and reservation[1] and tonumber(reservation[2] or '0') > now_ms then
    wait = tonumber(reservation[2]) - now_ms
  end
  if wait then
    redis.pcall('PEXPIRE', KEYS[3], ARGV[3])
    redis.pcall('PEXPIRE', KEYS[4], ARGV[3])
    if #again > 0 then return {2, wait, unpack(again)} end
    return {0, wait}
  end
elseif mine then
  redis.call('DEL', KEYS[1])
  --@include note_ended.lua
  local ended = ARGV[7] or ''
  local own = ARGV[5] ~= '' and (ended == '0' or ended == '1') and
              redis.pcall('LRANGE', KEYS[3], 0, -1)
  local taken_out = false
  if type(own) == 'table' and not own.err then  -- its own element: it ran, not to run again
    for _, el in ipairs(own) do
      if string.sub(el, 1, #ARGV[5] + 1) == ARGV[5] .. '\n' then
        taken_out = redis.call('LREM', KEYS[3], 1, el) > 0 or taken_out
      end
    end
  end
  if ARGV[5] ~= '' and (ended ~= '0' or taken_out or
                        redis.call('EXISTS', KEYS[3], KEYS[4]) > 0) then
    local ran = redis.pcall('HGET', KEYS[4], 'ran')  -- newest first, the last 20 of them
    local noted = (ended == '0' or ended == '1') and ARGV[5] or '~' .. ARGV[5]  -- ~: not ended
    local kept = {noted}
    if type(ran) == 'string' then
      for id in string.gmatch(ran, '%S+') do
        if #kept >= 20 then break end
        if id ~= ARGV[5] and id ~= '~' .. ARGV[5] then kept[#kept + 1] = id end
      end
    end
    redis.pcall('HSET', KEYS[4], 'ran', table.concat(kept, ' '))
    redis.pcall('PEXPIRE', KEYS[4], ARGV[3])
  end
else
  --@include released_before.lua
end
local handed, expired = false, {}
local kept = redis.pcall('HMGET', KEYS[4], 'id', 'el')
if not kept.err and kept[1] and kept[2] then
  handed = kept[2]
end
--@include line_head.lua
if not handed then
  local el, id = line_head(KEYS[3], now_ms, tonumber(ARGV[4]), expired)
  if el and type(redis.pcall('HSET', KEYS[4], 'id', id, 'el', el, 'kind', ARGV[6] or 'queue',
                             'new', '0')) ~= 'table' then
    handed = el
    redis.call('LPOP', KEYS[3])
  end
end
if handed then
  redis.call('HSET', KEYS[4], 'due', string.format('%.0f', now_ms + tonumber(ARGV[2])))
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
  redis.pcall('PEXPIRE', KEYS[3], ARGV[3])
end
return {1, handed or '', now_ms, unpack(expired)}
