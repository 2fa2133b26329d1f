--[[
Wake one waiter blocked on a wake list (BLPOP): the list is emptied, then holds one element,
with a lifetime. A key of another type is not ours: left as it is.

Defines:
  wake(list, element, lifetime)  list: the wake list key; lifetime: int ms. Returns nil when
      woken, else the error text of the refused RPUSH or PEXPIRE (a list left without a
      lifetime is deleted)
]]
local function wake(list, element, lifetime)
  redis.pcall('LTRIM', list, 1, 0)
  local woke = redis.pcall('RPUSH', list, element)
  if type(woke) ~= 'table' then
    woke = redis.pcall('PEXPIRE', list, lifetime)
    if type(woke) == 'table' then redis.call('DEL', list) end
  end
  if type(woke) == 'table' then return woke.err end
end
