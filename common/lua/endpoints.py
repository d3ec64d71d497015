"""Scripts of the endpoints: slot leases, routing and rate limits (worker/endpoints/)."""

from common.lua.clock import NOW_MS

# -- endpoint slots (worker/endpoints/capacity.py) ----------------------------------------------

# KEYS: drained set, then per endpoint its slots zset and its cap string
# ARGV: token, ttl_ms, rotation, channel, then per endpoint: url, configured cap, eligible 0/1
# Returns the 1-based index of the endpoint that gave a slot, or 0 when none is free.
# Only live leases count (ZCOUNT above now); expired ones are pruned by SLOT_RENEW and
# SLOT_SNAPSHOT, not on every request.
SLOT_ACQUIRE = (
    NOW_MS
    + """
local n = (#KEYS - 1) / 2
local best, best_free = 0, 0
for j = 0, n - 1 do
  local i = (j + tonumber(ARGV[3])) % n + 1
  local slots = KEYS[2 * i]
  local url = ARGV[3 * i + 2]
  if ARGV[3 * i + 4] == '1' and redis.call('SISMEMBER', KEYS[1], url) == 0 then
    local cap = tonumber(redis.call('GET', KEYS[2 * i + 1]) or ARGV[3 * i + 3])
    local free = cap - redis.call('ZCOUNT', slots, '(' .. now, '+inf')
    if free > best_free then best, best_free = i, free end
  end
end
if best == 0 then return 0 end
redis.call('ZADD', KEYS[2 * best], now + tonumber(ARGV[2]), ARGV[1])
return best
"""
)

# KEYS: drained set, then per endpoint in order of preference its slots zset and its cap string
# ARGV: token, ttl_ms, load bound, wait (1: may wait for the first choice), load floor, then
#       per endpoint: url, configured cap, eligible 0/1
# The policy of worker/endpoints/routing.py (``choose`` there is its reference): the first eligible
# endpoint whose load stays within bound x its share of the cluster's (by caps; the mean
# counted as at least the floor, a share of capacity) takes the request if it has a free slot;
# else the endpoint with the most free slots; with none free anywhere, returns -1 if that
# first endpoint is the first choice and the caller may wait for it. Returns the 1-based index
# of the endpoint that gave a slot, 0 when none is free, -1 to wait for the first choice.
SLOT_ROUTE = (
    NOW_MS
    + """
local n = (#KEYS - 1) / 2
local load, cap, ok = {}, {}, {}
local total, capacity = 0, 0
for i = 1, n do
  -- Live leases counted, not pruned: the renewer prunes (as in SLOT_ACQUIRE).
  load[i] = redis.call('ZCOUNT', KEYS[2 * i], '(' .. now, '+inf')
  cap[i] = tonumber(redis.call('GET', KEYS[2 * i + 1]) or ARGV[3 * i + 4])
  ok[i] = ARGV[3 * i + 5] == '1' and redis.call('SISMEMBER', KEYS[1], ARGV[3 * i + 3]) == 0
  if ok[i] then total, capacity = total + load[i], capacity + cap[i] end
end
if capacity == 0 then return 0 end
local share = tonumber(ARGV[3]) * math.max((total + 1) / capacity, tonumber(ARGV[5]))
local pick, best, best_free = 0, 0, 0
for i = 1, n do
  if ok[i] then
    if pick == 0 and load[i] + 1 <= math.ceil(share * cap[i]) then pick = i end
    if cap[i] - load[i] > best_free then best, best_free = i, cap[i] - load[i] end
  end
end
if pick > 0 and load[pick] < cap[pick] then
  best = pick
elseif pick == 1 and ARGV[4] == '1' then
  return -1
end
if best == 0 then return 0 end
redis.call('ZADD', KEYS[2 * best], now + tonumber(ARGV[2]), ARGV[1])
return best
"""
)

# KEYS: slots   ARGV: token, channel, message (default '1'; the endpoint's name, so that a
# waiter for that endpoint in particular is woken first)   (wakes waiters in every process)
SLOT_RELEASE = """
local n = redis.call('ZREM', KEYS[1], ARGV[1])
if n == 1 then redis.call('PUBLISH', ARGV[2], ARGV[3] or '1') end
return n
"""

# KEYS: slots   ARGV: ttl_ms, token...   returns the tokens no longer in the set
# Expired leases (their holder died) are pruned first. XX: only a lease still in the set is
# extended. A missing token was either given back after the renewer's snapshot (re-adding it
# would count a request that is over: phantom capacity) or expired and pruned; the caller
# tells the two apart and puts back only the second.
SLOT_RENEW = (
    NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local missing = {}
for i = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i]) == 0
      and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    table.insert(missing, ARGV[i])
  end
end
return missing
"""
)

# KEYS: slots   ARGV: ttl_ms, token...   returns how many were put back
# For requests still running whose lease expired (a renewer that fell behind): counting them
# again is the truth, even if the cap is overshot until one ends.
SLOT_RESTORE = (
    NOW_MS
    + """
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[1]), ARGV[i])
end
return n
"""
)

# KEYS: per endpoint its slots zset and cap string   ARGV: configured cap per endpoint
# Returns per endpoint: in flight, effective cap, 1 if the cap comes from Redis else 0.
SLOT_SNAPSHOT = (
    NOW_MS
    + """
local out = {}
for i = 1, #KEYS / 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[2 * i - 1], '-inf', now)
  local stored = redis.call('GET', KEYS[2 * i])
  table.insert(out, redis.call('ZCARD', KEYS[2 * i - 1]))
  table.insert(out, tonumber(stored or ARGV[i]))
  table.insert(out, stored and 1 or 0)
end
return out
"""
)

# -- rate limits (worker/endpoints/ratelimit.py) ------------------------------------------------

# KEYS: tat   ARGV: cost, interval_ms, burst_ms, charge_only (1: pay without being checked)
# The same formula as ``gcra``; returns the wait in ms (0: admitted and paid).
GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
local cost, interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local base = math.max(tat, now)
local wait = base + cost * interval - burst - now
if wait > 0 and ARGV[4] ~= '1' then return tostring(wait) end
-- A refund (negative cost) gives back unused budget, never credit for time already past.
local new = math.max(base + cost * interval, now)
redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil(new - now + burst) + 1000)
return '0'
"""
