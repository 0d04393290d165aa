-- One lease renewal of one gateway replica, atomically, for all the plans it admits against.
-- The grant is the reference model kvpool.domain.lease.grant.decide_grant, line for line;
-- tests/integration/test_lease_store.py runs both on the same random inputs.
--
-- KEYS[1..n]   one hash per plan (pool and track): member -> {"claim":{...},"report":...,"exp":ms}
-- KEYS[n+1]    the members hash: member -> expiry (ms, Redis time)
-- KEYS[n+2]    the epoch: when this Redis first saw a renewal (ms); absent after a restart
-- ARGV[1]      this member's id
-- ARGV[2]      member TTL (ms): a member's claims are forgotten this long after it renewed
-- ARGV[3]      JSON: {"plans":[{"groups":[[capacity,[component,...]],...],
--                               "desired":{component:n}, "held":{component:n}, "report":{...}}]}
-- Returns JSON: {"now":ms,"warming":bool,"members":n,
--                "plans":[{"granted":{...},"claim":{...},"reports":{member:report}}]}
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local request = cjson.decode(ARGV[3])
local n = #request.plans
local members_key, epoch_key = KEYS[n + 1], KEYS[n + 2]

local epoch = tonumber(redis.call('GET', epoch_key))
if not epoch then
  epoch = now
  redis.call('SET', epoch_key, now)
end
redis.call('PEXPIRE', epoch_key, ttl * 100)
local warming = (now - epoch) < ttl

redis.call('HSET', members_key, me, now + ttl)
redis.call('PEXPIRE', members_key, ttl * 20)
local live = 0
local members = redis.call('HGETALL', members_key)
for i = 1, #members, 2 do
  if tonumber(members[i + 1]) <= now then
    redis.call('HDEL', members_key, members[i])
  else
    live = live + 1
  end
end

local function count(t, name)
  local v = t[name]
  if v == nil or v == cjson.null then return 0 end
  return tonumber(v)
end

local out = {}
for p = 1, n do
  local plan = request.plans[p]
  local key = KEYS[p]
  local others, reports = {}, {}
  local entries = redis.call('HGETALL', key)
  for i = 1, #entries, 2 do
    local member, entry = entries[i], cjson.decode(entries[i + 1])
    if member ~= me then
      if entry.exp <= now then
        redis.call('HDEL', key, member)
      else
        for name, value in pairs(entry.claim) do
          others[name] = count(others, name) + tonumber(value)
        end
        reports[member] = entry.report
      end
    end
  end
  local granted, claim, grouped = {}, {}, {}
  for _, group in ipairs(plan.groups) do
    local free = tonumber(group[1])
    for _, name in ipairs(group[2]) do
      free = free - count(others, name)
    end
    for _, name in ipairs(group[2]) do
      grouped[name] = true
      local keep = math.max(0, count(plan.held, name))
      local give = math.max(0, math.min(count(plan.desired, name), free))
      if warming then give = math.min(give, keep) end
      free = free - math.max(give, keep)
      if give > 0 then granted[name] = give end
      local mine = math.max(give, keep)
      if mine > 0 then claim[name] = mine end
    end
  end
  for name, value in pairs(plan.held) do
    if not grouped[name] and tonumber(value) > 0 then claim[name] = tonumber(value) end
  end
  reports[me] = plan.report
  redis.call('HSET', key, me, cjson.encode({claim = claim, report = plan.report, exp = now + ttl}))
  redis.call('PEXPIRE', key, ttl * 20)
  out[p] = {granted = granted, claim = claim, reports = reports}
end
return cjson.encode({now = now, warming = warming, members = live, plans = out})
