--[[
The next run waiting in a key's line: its head element, once the elements past the wait
timeout before it are popped. The head itself stays in the line.

Defines:
  line_head(line, now_ms, timeout, expired)  line: the line key (elements "<task id>\n<ms
      accepted>\n<message>"); now_ms: clock_ms(); timeout: int ms (0: none); expired: a
      table the expired elements are appended to. Returns the head element and its task
      id, or nil when the line is empty (or a key of another type)
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
