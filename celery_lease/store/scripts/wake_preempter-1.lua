--[[
Tell the execution that took a lease over (lease_on_conflict="preempt" with
lease_preempt_grace) that the execution it preempted has ended: put that execution's token in
the key's wake list, which the newcomer waits on (BLPOP) for at most the grace. The list holds
at most this one element and has a lifetime; a wake list of another type is not ours and is
left alone. A separate script: only a preempted execution's end sends it.

KEYS[1]  the wake list key (the lease key's hash tag)

ARGV[1]  the preempted execution's token
ARGV[2]  the element's lifetime, int milliseconds

Returns:
  1     the token is in the list
  text  the server refused the push (its error message, e.g. OOM or an ACL refusal)
]]
redis.pcall('LTRIM', KEYS[1], 1, 0)
local pushed = redis.pcall('RPUSH', KEYS[1], ARGV[1])
if type(pushed) ~= 'table' then
  pushed = redis.pcall('PEXPIRE', KEYS[1], ARGV[2])
  if type(pushed) == 'table' then redis.call('DEL', KEYS[1]) end
end
if type(pushed) == 'table' then return pushed.err end
return 1
