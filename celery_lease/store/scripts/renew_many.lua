--[[
Renew many leases of one TTL in one call (one primary only: a cluster's keys live on several),
each as renew-1.lua does. One character per lease in the reply, so the client parses one string
instead of thousands of replies. The client sends at most RENEW_BATCH (1 000) leases per call:
Redis runs one script at a time, and a call for 1 000 keys takes about a millisecond. A key of
another type (WRONGTYPE) is held by another: '2'.

KEYS[1..n]    the lease keys
ARGV[1]       the lifetime, int milliseconds (the TTL)
ARGV[2..n+1]  the holders' tokens, each followed by ':' ("<token>:"), in the order of KEYS

Returns a string of n characters, one per lease in the order of KEYS:
  '1'  renewed
  '0'  the key is absent
  '2'  the key is held by another token
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
