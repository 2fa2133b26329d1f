--[[
The next run waiting in a key's line (release_handoff-4.lua, release_slot_handoff-4.lua): the
head element, once the elements past the wait timeout before it are taken out (LPOP) and noted.
The head itself stays in the line: the including script writes its reservation first, then
pops it, so a refused write leaves the line as it was.

KEYS[...]  none of its own: line_head is handed the including script's line key

Defines:
  line_head(line, now_ms, timeout, expired)  line: the line key, elements
      "<task id>\n<ms accepted>\n<message>"; now_ms: the store's clock, int ms; timeout: the
      wait timeout, int ms (0: none); expired: a table the expired elements are appended to.
      Returns the head element and its task id, or nil when the line is empty (or a key of
      another type).
]]
local function line_head(line, now_ms, timeout, expired)
  while true do
    local el = redis.pcall('LINDEX', line, 0)
    if type(el) ~= 'string' then return nil end  -- empty (false), or a key of another type
    local at = tonumber(string.match(el, '^[^\n]*\n(%d+)\n') or '0')
    if timeout > 0 and now_ms - at > timeout then
      expired[#expired + 1] = el
      redis.call('LPOP', line)
    else
      return el, string.match(el, '^([^\n]*)\n') or ''
    end
  end
end
