--[[
Renew many leases of one TTL in one call (one primary only: a cluster's keys live on several),
each as renew-1.lua does. One character per lease in the reply, so the client parses one string
instead of thousands of replies. The client sends at most RENEW_BATCH (1 000) leases per call:
Redis runs one script at a time, and a call for 1 000 keys takes about a millisecond. A key of
another type than a string is renewed as a slot of a limited key when it is a hash of slots
(lease_limit=N, includes/renew_slot.lua: only this token's slot), so every lease of a process
shares the one round trip; any other type is held by another: '2'.

KEYS[1..n]    the lease keys
ARGV[1]       the lifetime, int milliseconds (the TTL)
ARGV[2..n+1]  the holders' tokens, each followed by ':' ("<token>:"), in the order of KEYS

Returns a string of n characters, one per lease in the order of KEYS:
  '1'  renewed
  '0'  the key is absent
  '2'  the key is held by another token
]]
--@include renew_slot.lua
local ttl, out = ARGV[1], {}
for i, key in ipairs(KEYS) do
  local cur, held = redis.pcall('GET', key), ARGV[i + 1]  -- held: '<token>:'
  if type(cur) == 'table' then
    if not string.find(cur.err or '', 'WRONGTYPE', 1, true) then return cur end
    cur = renew_slot(key, string.sub(held, 1, -2), ttl)  -- a hash of slots, or another type
    if type(cur) == 'table' then return cur end
    out[i] = cur
  elseif cur and string.sub(cur, 1, #held) == held then
    redis.call('PEXPIRE', key, ttl)
    out[i] = '1'
  else
    out[i] = cur and '2' or '0'
  end
end
return table.concat(out)
