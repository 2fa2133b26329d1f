--[[
Renew one slot of a limited key, token-checked: its deadline moves to now plus the TTL, and
the hash's lifetime is raised to it when shorter. Uses clock_ms() (lib/clock.lua).

Defines:
  renew_slot(key, token, ttl)  key: a lease key (a hash of slots); ttl: int ms. Returns '1'
      renewed, '0' the key is absent, '2' no live slot of token there (or not a hash), or
      the error table of a refused write
]]
local function renew_slot(key, token, ttl)
  ttl = tonumber(ttl)
  local slot = redis.pcall('HGET', key, token)
  if type(slot) == 'table' then
    if string.find(slot.err or '', 'WRONGTYPE', 1, true) then return '2' end
    return slot
  end
  if not slot then return redis.call('EXISTS', key) == 1 and '2' or '0' end
  local now_ms = clock_ms()
  local due, rest = string.match(slot, '^(%d+):(.*)$')
  if not due or tonumber(due) <= now_ms then return '2' end
  local done = redis.pcall('HSET', key, token, (now_ms + ttl) .. ':' .. rest)
  if type(done) == 'table' then return done end
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  return '1'
end
