"""Every Lua script EagleGen runs in Redis, in one place.

A transition that touches more than one key is one script, so a crash between two steps cannot
leave a sample half-moved. Times come from the Redis clock (``NOW_MS``), never from the
caller's: workers on many hosts with drifting clocks agree on when a lease expires.
Callers register a script with ``client.register_script(lua.NAME)`` and keep the handle.
"""

# Sets ``now`` to the Redis server's time in milliseconds.
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# -- a run's samples (common/store.py) -------------------------------------------------------

# KEYS: accepted, pending, prompts   ARGV: id, sample json
ACCEPT = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return 1
"""

# KEYS: pending, leases, lease_owner, attempts, counters   ARGV: id, owner, ttl_ms, retries
# An attempt beyond the message's own retries means the message came again (the reconciler,
# a hand-back, the visibility timeout): counted as a redelivery.
LEASE_ACQUIRE = (
    NOW_MS
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 'done' end
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
local owner = redis.call('HGET', KEYS[3], ARGV[1])
if expiry and tonumber(expiry) > now and owner ~= ARGV[2] then return 'leased' end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
local attempts = redis.call('HINCRBY', KEYS[4], ARGV[1], 1)
if attempts > tonumber(ARGV[4]) + 1 then redis.call('HINCRBY', KEYS[5], 'redeliveries', 1) end
return 'ok'
"""
)

# KEYS: leases, lease_owner, pending   ARGV: ttl_ms, id1, owner1, id2, owner2...
# Returns the ids whose lease another worker now holds. A lease with no owner at all (reaped
# while Redis was unreachable long enough for every lease to look expired) is taken back: its
# holder is alive, or it would not be renewing.
LEASE_RENEW = (
    NOW_MS
    + """
local lost = {}
for i = 2, #ARGV, 2 do
  local owner = redis.call('HGET', KEYS[2], ARGV[i])
  if owner == ARGV[i + 1]
      or (not owner and redis.call('SISMEMBER', KEYS[3], ARGV[i]) == 1) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""
)

# KEYS: leases, lease_owner   ARGV: id, owner
LEASE_RELEASE = """
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

# KEYS: pending, results, ready, leases, lease_owner, prompts, partial, attempts, counters
# ARGV: id, record json, completion tokens, token
# 1 stored, 0 already finished, -1 refused: another worker holds the lease (ours was lost).
STORE_RESULT = """
local owner = redis.call('HGET', KEYS[5], ARGV[1])
if owner and owner ~= ARGV[4] then return -1 end
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
redis.call('HDEL', KEYS[8], ARGV[1])
redis.call('HINCRBY', KEYS[9], 'completion_tokens', tonumber(ARGV[3]))
return 1
"""

# KEYS: pending, failed, leases, lease_owner, counters   ARGV: id, failure json, kind, token
# Refused (-1) while another worker holds the sample's lease: it may yet succeed.
STORE_FAILURE = """
local owner = redis.call('HGET', KEYS[4], ARGV[1])
if owner and owner ~= ARGV[4] then return -1 end
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HINCRBY', KEYS[5], 'failed:' .. ARGV[3], 1)
return 1
"""

# KEYS: failed, pending, attempts   ARGV: max ids   returns the ids moved back to pending
REQUEUE_FAILED = """
local ids = redis.call('HKEYS', KEYS[1])
local moved = {}
for i = 1, math.min(#ids, tonumber(ARGV[1])) do
  redis.call('HDEL', KEYS[1], ids[i])
  redis.call('HDEL', KEYS[3], ids[i])
  redis.call('SADD', KEYS[2], ids[i])
  table.insert(moved, ids[i])
end
return moved
"""

# The collector's scripts are fenced: they act only for the holder of the run's collector lock
# (ARGV[1] must be the lock's value). A collector paused past its lock (a VM freeze, a stuck
# disk) wakes up unable to take or delete what its successor is writing.

# KEYS: lock, ready, collecting   ARGV: token, limit
# Moves up to ``limit`` ids from ready to collecting; returns them, or -1 when not the holder.
TAKE_READY = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local ids = redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[2]) - 1)
if #ids == 0 then return ids end
redis.call('LTRIM', KEYS[2], #ids, -1)
redis.call('RPUSH', KEYS[3], unpack(ids))
return ids
"""

# KEYS: lock, collecting, results, counters   ARGV: token, id...
# After the lines are fsynced: those ids (only those) leave collecting and results and count
# as written. Returns how many results left Redis, or -1 when not the holder.
COMMIT_COLLECTED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local n = 0
for i = 2, #ARGV do
  redis.call('LREM', KEYS[2], 1, ARGV[i])
  n = n + redis.call('HDEL', KEYS[3], ARGV[i])
end
redis.call('HINCRBY', KEYS[4], 'written', n)
return n
"""

# KEYS: retired, pending, results, ready, collecting, failed, then every other key of the run
# ARGV: summary json, force (1: retire whatever is left)
# 1 retired; 0 refused (work not finished or not on disk); -1 already retired. UNLINK: a
# million-member set is freed in the background, not while Redis blocks.
RETIRE_RUN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
if ARGV[2] ~= '1' and (redis.call('SCARD', KEYS[2]) + redis.call('HLEN', KEYS[3])
    + redis.call('LLEN', KEYS[4]) + redis.call('LLEN', KEYS[5])
    + redis.call('HLEN', KEYS[6])) > 0 then
  return 0
end
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""

# KEYS: leases, lease_owner   returns the ids whose lease expired (their holder is gone)
REAP_EXPIRED = (
    NOW_MS
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 1, #ids do
  redis.call('ZREM', KEYS[1], ids[i])
  redis.call('HDEL', KEYS[2], ids[i])
end
return ids
"""
)

# KEYS: pending, results, ready   ARGV: id   re-publish a result the collector can't see
REQUEUE_RESULT = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[1])
return 1
"""

# KEYS: leases   returns how many leases have expired (their holder stopped renewing)
COUNT_EXPIRED = (
    NOW_MS
    + """
return redis.call('ZCOUNT', KEYS[1], '-inf', now)
"""
)

# -- endpoint slots (worker/capacity.py) -----------------------------------------------------

# KEYS: drained set, then per endpoint its slots zset and its cap string
# ARGV: token, ttl_ms, rotation, channel, then per endpoint: url, configured cap, eligible 0/1
# Returns the 1-based index of the endpoint that gave a slot, or 0 when none is free.
SLOT_ACQUIRE = (
    NOW_MS
    + """
local n = (#KEYS - 1) / 2
local best, best_free = 0, 0
for j = 0, n - 1 do
  local i = (j + tonumber(ARGV[3])) % n + 1
  local slots = KEYS[2 * i]
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  local url = ARGV[3 * i + 2]
  if ARGV[3 * i + 4] == '1' and redis.call('SISMEMBER', KEYS[1], url) == 0 then
    local cap = tonumber(redis.call('GET', KEYS[2 * i + 1]) or ARGV[3 * i + 3])
    local free = cap - redis.call('ZCARD', slots)
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
# The policy of worker/routing.py (``choose`` there is its reference): the first eligible
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
  local slots = KEYS[2 * i]
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  load[i] = redis.call('ZCARD', slots)
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
# XX: only a lease still in the set is extended. A missing token was either given back after
# the renewer's snapshot (re-adding it would count a request that is over: phantom capacity)
# or expired and pruned; the caller tells the two apart and puts back only the second.
SLOT_RENEW = (
    NOW_MS
    + """
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

# -- rate limits (worker/ratelimit.py) -------------------------------------------------------

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
