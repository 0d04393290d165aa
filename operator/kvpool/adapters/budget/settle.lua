-- Correct charges to the real usage.
-- KEYS: one hash per settlement.  ARGV: per key: bucket, delta.  Counters never go below 0.
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local field = 't' .. ARGV[2 * i - 1]
    local v = redis.call('HINCRBY', KEYS[i], field, tonumber(ARGV[2 * i]))
    if v < 0 then redis.call('HSET', KEYS[i], field, 0) end
  end
end
return 1
