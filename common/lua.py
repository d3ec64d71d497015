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

# KEYS: accepted, pending, prompts   ARGV: id1, sample json1, id2, sample json2...
# A batch in one call: per id 1 if new, 0 if the run already had it. New ids join pending and
# their prompts are stored with one command each for the whole batch.
ACCEPT = """
local fresh, ids, prompts = {}, {}, {}
for i = 1, #ARGV, 2 do
  local new = redis.call('SADD', KEYS[1], ARGV[i])
  fresh[#fresh + 1] = new
  if new == 1 then
    ids[#ids + 1] = ARGV[i]
    prompts[#prompts + 1] = ARGV[i]
    prompts[#prompts + 1] = ARGV[i + 1]
  end
end
if #ids > 0 then
  redis.call('SADD', KEYS[2], unpack(ids))
  redis.call('HSET', KEYS[3], unpack(prompts))
end
return fresh
"""

# KEYS: pending, leases, lease_owner, prompts, counters
# ARGV: id, owner, ttl_ms, retries, attempts field, partial field, checkpoint field
# Everything a worker needs to start on a sample, in one call: the lease, the attempt count,
# the prompt, the turns answered by earlier attempts and the checkpoint of the turn they were
# on. Returns {'ok', attempts, prompt, partial, checkpoint} (nil or empty when absent), or
# {'done'} / {'leased'}.
# An attempt beyond the message's own retries means the message came again (the reconciler,
# a hand-back, the visibility timeout): counted as a redelivery. A lease and its owner are
# always written and removed together, so a sample without an owner has no lease to check.
LEASE_TAKE = (
    NOW_MS
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return {'done'} end
local owner = redis.call('HGET', KEYS[3], ARGV[1])
if owner and owner ~= ARGV[2] then
  local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if expiry and tonumber(expiry) > now then return {'leased'} end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
local attempts = redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
if attempts > tonumber(ARGV[4]) + 1 then redis.call('HINCRBY', KEYS[5], 'redeliveries', 1) end
local found = redis.call('HMGET', KEYS[4], ARGV[1], ARGV[6], ARGV[7])
return {'ok', attempts, found[1], found[2], found[3]}
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

# KEYS: pending, results, ready, leases, lease_owner, prompts, counters
# ARGV: id, record json, completion tokens, token, attempts field, partial field,
#       checkpoint field
# A sample's whole finish: 1 stored, 0 already finished, -1 refused: another worker holds the
# lease (ours was lost). Our lease ends here in every case but the last.
STORE_RESULT = """
local owner = redis.call('HGET', KEYS[5], ARGV[1])
if owner and owner ~= ARGV[4] then return -1 end
local stored = redis.call('SREM', KEYS[1], ARGV[1])
if owner then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
if stored == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1], ARGV[5], ARGV[6], ARGV[7])
redis.call('HINCRBY', KEYS[7], 'completion_tokens', tonumber(ARGV[3]))
return 1
"""

# KEYS: pending, failed, leases, lease_owner, counters, prompts
# ARGV: id, failure json, kind, token, checkpoint field
# Refused (-1) while another worker holds the sample's lease: it may yet succeed. The prompt
# and answered turns stay (``requeue failed`` runs the sample again); the checkpoint goes: the
# failure may be the continuation itself (a server refusing the token-id prompt).
STORE_FAILURE = """
local owner = redis.call('HGET', KEYS[4], ARGV[1])
if owner and owner ~= ARGV[4] then return -1 end
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[5])
redis.call('HINCRBY', KEYS[5], 'failed:' .. ARGV[3], 1)
return 1
"""

# KEYS: failed, pending, prompts   ARGV: max ids, attempts suffix, checkpoint suffix
# Returns the ids moved back to pending; their attempts count from zero again, their answered
# turns are kept, a checkpoint (none is left by STORE_FAILURE; older runs) is not.
REQUEUE_FAILED = """
local ids = redis.call('HKEYS', KEYS[1])
local moved = {}
for i = 1, math.min(#ids, tonumber(ARGV[1])) do
  redis.call('HDEL', KEYS[1], ids[i])
  redis.call('HDEL', KEYS[3], ids[i] .. ARGV[2], ids[i] .. ARGV[3])
  redis.call('SADD', KEYS[2], ids[i])
  table.insert(moved, ids[i])
end
return moved
"""

# KEYS: lease_owner, prompts, checkpoint log
# ARGV: id, token, checkpoint field, header ('' to append), piece, log length expected
# Fenced: written only while ``token`` is the sample's lease owner. A worker paused past its
# lease (SIGSTOP, a VM freeze) wakes up unable to overwrite the checkpoint of the worker that
# took the sample over; a lease not yet taken over is still its own, so its newer progress
# is kept. A lease with no owner (reaped) refuses too. With a header, the checkpoint starts
# again: header and log replaced (common/checkpoint_log.py). Without one the piece is appended,
# only if the log is as long as its writer last left it and its header is still there (else
# something else wrote or cleared it since). Returns the log's length in bytes once written,
# 0 refused (not the lease holder), -1 not appended (the caller saves it whole).
SAVE_CHECKPOINT = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('SET', KEYS[3], ARGV[5])
  return redis.call('STRLEN', KEYS[3])
end
local head = redis.call('HGET', KEYS[2], ARGV[3])
if not head or head == '' or redis.call('STRLEN', KEYS[3]) ~= tonumber(ARGV[6]) then
  return -1
end
return redis.call('APPEND', KEYS[3], ARGV[5])
"""

# KEYS: lease_owner, requests   ARGV: id, token, request json
# The request a lease holder has running, kept for whoever takes the lease over (it aborts it
# on the server). Fenced like a checkpoint: a worker paused past its lease cannot name its
# stale request as the sample's current one. Returns 1 written, 0 refused.
SAVE_REQUEST = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

# KEYS: requests   ARGV: id, token   returns the sample's running request if ``token`` sent
# it (and removes it), else nil: a request someone else already popped is theirs to abort.
POP_OWN_REQUEST = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw or cjson.decode(raw)['token'] ~= ARGV[2] then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
return raw
"""

# The collector's scripts are fenced: they act only for the holder of the run's collector lock
# (ARGV[1] must be the lock's value). A collector paused past its lock (a VM freeze, a stuck
# disk) wakes up unable to take or delete what its successor is writing.

# KEYS: lock, ready, collecting   ARGV: token, limit
# Ids a previous turn took and did not commit (a crash, a commit lost to a Redis restart) come
# back first, all of them; else up to ``limit`` ids move from ready to collecting. Returns the
# ids, or -1 when not the holder.
TAKE_READY = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local left = redis.call('LRANGE', KEYS[3], 0, -1)
if #left > 0 then return left end
local ids = redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[2]) - 1)
if #ids == 0 then return ids end
redis.call('LTRIM', KEYS[2], #ids, -1)
redis.call('RPUSH', KEYS[3], unpack(ids))
return ids
"""

# KEYS: lock, collecting, results, counters   ARGV: token, id...
# After the lines are fsynced: those ids (only those) leave collecting and results and count
# as written. Returns how many results left Redis, or -1 when not the holder. The ids are
# normally the whole head of the collecting list (what TAKE_READY returned), cut in one LTRIM;
# anything else is removed id by id. Fields go in slices: Lua's unpack has a stack limit.
COMMIT_COLLECTED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local n = #ARGV - 1
if n == 0 then return 0 end
local head = redis.call('LRANGE', KEYS[2], 0, n - 1)
local same = true
for i = 1, n do
  if head[i] ~= ARGV[i + 1] then same = false break end
end
if same then
  redis.call('LTRIM', KEYS[2], n, -1)
else
  for i = 2, #ARGV do redis.call('LREM', KEYS[2], 1, ARGV[i]) end
end
local deleted = 0
for first = 2, #ARGV, 1000 do
  local last = math.min(first + 999, #ARGV)
  deleted = deleted + redis.call('HDEL', KEYS[3], unpack(ARGV, first, last))
end
redis.call('HINCRBY', KEYS[4], 'written', deleted)
return deleted
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
