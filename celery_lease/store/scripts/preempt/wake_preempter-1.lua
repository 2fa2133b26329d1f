--[[
Tell the newcomer that took a lease over (lease_preempt_grace) that the execution it preempted
has ended: put that execution's token in the key's wake list, which the newcomer waits on.

KEYS[1]  the wake list key (the lease key's hash tag)

ARGV[1]  the preempted execution's token
ARGV[2]  the element's lifetime, int milliseconds

Returns:
  1     the token is in the list
  text  the server refused the push (its error message, e.g. OOM or an ACL refusal)
]]
--@include wake.lua
return wake(KEYS[1], ARGV[1], ARGV[2]) or 1
