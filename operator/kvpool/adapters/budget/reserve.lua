-- Check every window of a tenant and, if all allow it, charge the reservation (atomic).
-- KEYS: one hash per window.  ARGV: now, tokens, then per window: seconds, tokens, requests
-- (-1: no request limit), sub-buckets.  Returns {1, usedTokens1, usedRequests1, ...} or
-- {0, windowNumber, retryAfter (string), kind, usedTokens, usedRequests}.
local now = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local used = {}
local worst = nil
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 4
  local w = tonumber(ARGV[base + 1])
  local limit_t = tonumber(ARGV[base + 2])
  local limit_r = tonumber(ARGV[base + 3])
  local g = w / tonumber(ARGV[base + 4])
  local oldest = math.floor((now - w) / g)
  local flat = redis.call('HGETALL', KEYS[i])
  local live_t, live_r, idx = {}, {}, {}
  local sum_t, sum_r = 0, 0
  for j = 1, #flat, 2 do
    local field, value = flat[j], tonumber(flat[j + 1])
    local b = tonumber(string.sub(field, 2))
    if b < oldest then
      redis.call('HDEL', KEYS[i], field)
    else
      if live_t[b] == nil and live_r[b] == nil then table.insert(idx, b) end
      if string.sub(field, 1, 1) == 't' then
        live_t[b] = value; sum_t = sum_t + value
      else
        live_r[b] = value; sum_r = sum_r + value
      end
    end
  end
  used[i] = {sum_t, sum_r}
  local kind, excess, field = nil, 0, nil
  if tokens > limit_t then
    kind = 'never'
  elseif sum_t + tokens > limit_t then
    kind, excess, field = 'tokens', sum_t + tokens - limit_t, live_t
  elseif limit_r >= 0 and sum_r + 1 > limit_r then
    kind, excess, field = 'requests', sum_r + 1 - limit_r, live_r
  end
  if kind ~= nil then
    local retry = w
    if field ~= nil then
      table.sort(idx)
      local freed = 0
      for _, b in ipairs(idx) do
        freed = freed + (field[b] or 0)
        if freed >= excess then
          retry = math.max(0, (b + 1) * g + w - now)
          break
        end
      end
    end
    if worst == nil or retry > worst[2] then
      worst = {i, retry, kind, sum_t, sum_r}
    end
  end
end
if worst ~= nil then
  return {0, worst[1], tostring(worst[2]), worst[3], worst[4], worst[5]}
end
local out = {1}
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 4
  local w = tonumber(ARGV[base + 1])
  local g = w / tonumber(ARGV[base + 4])
  local b = math.floor(now / g)
  redis.call('HINCRBY', KEYS[i], 't' .. b, tokens)
  redis.call('HINCRBY', KEYS[i], 'r' .. b, 1)
  redis.call('PEXPIRE', KEYS[i], math.ceil((w + g) * 1000) + 1000)
  table.insert(out, used[i][1])
  table.insert(out, used[i][2])
end
return out
