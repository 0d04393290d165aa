-- What a tenant has used per window (read only).
-- KEYS: one hash per window.  ARGV: now, then per window: seconds, sub-buckets.
-- Returns {usedTokens1, usedRequests1, ...}.
local now = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local w = tonumber(ARGV[2 * i])
  local g = w / tonumber(ARGV[2 * i + 1])
  local oldest = math.floor((now - w) / g)
  local flat = redis.call('HGETALL', KEYS[i])
  local t, r = 0, 0
  for j = 1, #flat, 2 do
    local b = tonumber(string.sub(flat[j], 2))
    if b >= oldest then
      if string.sub(flat[j], 1, 1) == 't' then t = t + tonumber(flat[j + 1])
      else r = r + tonumber(flat[j + 1]) end
    end
  end
  table.insert(out, t)
  table.insert(out, r)
end
return out
