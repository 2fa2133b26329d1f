--[[
Which of the given commands the user running this script may not run, asked of the server's
ACL without running any (redis.acl_check_cmd, Redis 7.0 or later). Writes nothing.

KEYS[1]     a key under the lease_key_prefix checked (never read or written)
ARGV[1..n]  the commands, each as its words separated by spaces, %k standing for KEYS[1]
            ("SET %k 1", "WAIT 0 0")

Returns the ARGV indexes (1-based, ascending) of the commands the user may not run; empty when
it may run them all.
]]
local denied = {}
for i, spec in ipairs(ARGV) do
  local words = {}
  for word in string.gmatch(spec, '%S+') do
    words[#words + 1] = (word == '%k') and KEYS[1] or word
  end
  if not redis.acl_check_cmd(unpack(words)) then denied[#denied + 1] = i end
end
return denied
