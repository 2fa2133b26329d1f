--[[
The renewal of one slot of a limited key (lease_limit=N, acquire_slot-3.lua), for
renew_slots.lua and renew_slot-1.lua: its own deadline moves to the store's
clock plus the TTL while its token still has a slot there that has not passed its deadline
(token-checked: no other slot is touched). The hash's lifetime is raised to that deadline when
it is shorter (PEXPIRE sets it, and never lowers it here: another slot may end later). HSET to
an existing field is the only write, so a full server (maxmemory) may refuse it: the error
is the reply, as a renewal's store error.

KEYS[...]  none of its own: renew_slot is handed one of the including script's keys

Defines:
  renew_slot(key, token, ttl)  key: a lease key (a hash of slots); token: the
                               holder's token; ttl: int milliseconds. Returns '1' renewed,
                               '0' the key is absent, '2' held by another (no live slot of
                               this token there: it ended or expired, or the key is another
                               tool's hash or of another type), or the error table of a
                               refused write.
]]
local function renew_slot(key, token, ttl)
  ttl = tonumber(ttl)
  local slot = redis.pcall('HGET', key, token)
  if type(slot) == 'table' then
    if string.find(slot.err or '', 'WRONGTYPE', 1, true) then return '2' end
    return slot
  end
  if not slot then return redis.call('EXISTS', key) == 1 and '2' or '0' end
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local due, rest = string.match(slot, '^(%d+):(.*)$')
  if not due or tonumber(due) <= now_ms then return '2' end
  local done = redis.pcall('HSET', key, token, (now_ms + ttl) .. ':' .. rest)
  if type(done) == 'table' then return done end
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  return '1'
end
