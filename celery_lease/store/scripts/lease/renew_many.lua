--[[
Renew many leases of one TTL in one call (one primary only), each as lease/renew-1.lua does,
answered with one character per lease. The client sends at most RENEW_BATCH (1 000) a call.

KEYS[1..n]    the lease keys
ARGV[1]       the lifetime, int milliseconds (the TTL)
ARGV[2..n+1]  the holders' tokens, each followed by ':' ("<token>:"), in the order of KEYS

Returns a string of n characters, one per lease in the order of KEYS:
  '1'  renewed
  '0'  the key is absent
  '2'  the key is held by another token (or is a key of another type)
]]
local ttl, out = ARGV[1], {}
for i, key in ipairs(KEYS) do
  local cur, held = redis.pcall('GET', key), ARGV[i + 1]  -- held: '<token>:'
  if type(cur) == 'table' then
    if not string.find(cur.err or '', 'WRONGTYPE', 1, true) then return cur end
    cur = ''
  end
  if cur and string.sub(cur, 1, #held) == held then
    redis.call('PEXPIRE', key, ttl)
    out[i] = '1'
  else
    out[i] = cur and '2' or '0'
  end
end
return table.concat(out)
