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

# A sample is the lease holder's when its owner is the caller's token, or when it has no owner
# and the reaper's note names that token (reaped while its holder was paused or cut off, and
# not taken by anyone since). A lease its holder released has neither: it is nobody's.
# Expects ``pending``, ``owners``, ``reaped`` (keys), ``id`` and ``token`` (values).
IS_HOLDER = """
local function is_holder(owners, reaped, id, token)
  local owner = redis.call('HGET', owners, id)
  if owner then return owner == token end
  return redis.call('HGET', reaped, id) == token
end
"""

# KEYS: accepted, pending, prompts, retired, producers
# ARGV: producer id, heartbeat ttl_ms, id1, sample json1, id2, sample json2...
# A batch in one call: per id 1 if new, 0 if the run already had it; -1 (nothing stored) when
# the run is retired. New ids join pending and their prompts are stored with one command each
# for the whole batch. The producer's heartbeat is renewed with it (``runs retire`` waits for
# a live producer).
ACCEPT = (
    NOW_MS
    + """
if redis.call('EXISTS', KEYS[4]) == 1 then return -1 end
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), ARGV[1])
local fresh, ids, prompts = {}, {}, {}
for i = 3, #ARGV, 2 do
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
)

# KEYS: retired, producers   ARGV: producer id, ttl_ms (0: the producer stopped)
# A producer still feeding the run (waiting for room counts), or gone; -1 on a retired run.
PRODUCER_BEAT = (
    NOW_MS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if ARGV[2] == '0' then return redis.call('ZREM', KEYS[2], ARGV[1]) end
return redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
"""
)

# KEYS: retired, counters   ARGV: counter, amount   (a retired run's counters stay gone)
INCR_COUNTER = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('HINCRBY', KEYS[2], ARGV[1], tonumber(ARGV[2]))
"""

# KEYS: pending, leases, lease_owner, prompts, counters, reaped, retired
# ARGV: id, owner, ttl_ms, retries, attempts field, partial field, checkpoint field
# Everything a worker needs to start on a sample, in one call: the lease, the attempt count,
# the prompt, the turns answered by earlier attempts and the checkpoint of the turn they were
# on. Returns {'ok', attempts, prompt, partial, checkpoint} (nil or empty when absent), or
# {'done'} / {'leased'} / {'retired'}.
# An attempt beyond the message's own retries means the message came again (the reconciler,
# a hand-back, the visibility timeout): counted as a redelivery. A lease and its owner are
# always written and removed together, so a sample without an owner has no lease to check.
LEASE_TAKE = (
    NOW_MS
    + """
if redis.call('EXISTS', KEYS[7]) == 1 then return {'retired'} end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return {'done'} end
local owner = redis.call('HGET', KEYS[3], ARGV[1])
if owner and owner ~= ARGV[2] then
  local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if expiry and tonumber(expiry) > now then return {'leased'} end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[6], ARGV[1])
local attempts = redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
if attempts > tonumber(ARGV[4]) + 1 then redis.call('HINCRBY', KEYS[5], 'redeliveries', 1) end
local found = redis.call('HMGET', KEYS[4], ARGV[1], ARGV[6], ARGV[7])
return {'ok', attempts, found[1], found[2], found[3]}
"""
)

# KEYS: leases, lease_owner, pending, reaped   ARGV: ttl_ms, id1, owner1, id2, owner2...
# Returns the ids that are not ours any more: another worker holds them, or they ended. A
# lease the reaper took from this very holder (a pause, Redis unreachable long enough for
# every lease to look expired) is taken back while the sample is pending and no one else took
# it: its holder is alive, or it would not be renewing. A lease its holder released (a
# renewal from a snapshot taken just before) is never taken back: its generation is over.
LEASE_RENEW = (
    NOW_MS
    + IS_HOLDER
    + """
local lost = {}
for i = 2, #ARGV, 2 do
  if is_holder(KEYS[2], KEYS[4], ARGV[i], ARGV[i + 1])
      and redis.call('SISMEMBER', KEYS[3], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    redis.call('HDEL', KEYS[4], ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""
)

# KEYS: leases, lease_owner, reaped   ARGV: id, owner   (1 given back, 0 not ours)
LEASE_RELEASE = (
    IS_HOLDER
    + """
if not is_holder(KEYS[2], KEYS[3], ARGV[1], ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""
)

# KEYS: pending, lease_owner, prompts, reaped
# ARGV: id, token, partial field, turns json, checkpoint field
# The turns answered so far, for the lease holder of a pending sample only (1, else 0). The
# checkpoint of the turn just answered is emptied with it: it is done, not to be continued.
SAVE_PARTIAL = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 0 end
if not is_holder(KEYS[2], KEYS[4], ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4], ARGV[5], '')
return 1
"""
)

# KEYS: pending, results, ready, leases, lease_owner, prompts, counters, reaped
# ARGV: id, record json, completion tokens, token, attempts field, partial field,
#       checkpoint field
# A sample's whole finish: 1 stored, 0 already finished, -1 refused: the lease is not ours
# (another worker holds it, or it was given back). Our lease ends here but in the last case.
STORE_RESULT = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  if redis.call('HGET', KEYS[5], ARGV[1]) == ARGV[4] then
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('HDEL', KEYS[5], ARGV[1])
  end
  return 0
end
if not is_holder(KEYS[5], KEYS[8], ARGV[1], ARGV[4]) then return -1 end
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[8], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1], ARGV[5], ARGV[6], ARGV[7])
redis.call('HINCRBY', KEYS[7], 'completion_tokens', tonumber(ARGV[3]))
return 1
"""
)

# KEYS: pending, failed, leases, lease_owner, counters, prompts, reaped
# ARGV: id, failure json, kind, token, checkpoint field
# For the lease holder only (-1 otherwise: another worker may yet succeed); 0 already
# finished. The prompt and answered turns stay (``requeue failed`` runs the sample again); the
# checkpoint goes: the failure may be the continuation itself (a server refusing the token-id
# prompt).
STORE_FAILURE = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 0 end
if not is_holder(KEYS[4], KEYS[7], ARGV[1], ARGV[4]) then return -1 end
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[5])
redis.call('HINCRBY', KEYS[5], 'failed:' .. ARGV[3], 1)
return 1
"""
)

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

# KEYS: lease_owner, prompts   ARGV: id, token, checkpoint field, checkpoint json
# Fenced: written only while ``token`` is the sample's lease owner. A worker paused past its
# lease (SIGSTOP, a VM freeze) wakes up unable to overwrite the checkpoint of the worker that
# took the sample over; a lease not yet taken over is still its own, so its newer progress
# is kept. A lease with no owner (reaped) refuses too. Returns 1 written, 0 refused.
SAVE_CHECKPOINT = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return 1
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

# KEYS: retired, pending, results, ready, collecting, failed, producers, collector lock,
#       accepted, counters, then every other key of the run
# ARGV: summary json, force (1: retire whatever is left)
# 1 retired; 0 refused (work not finished or not on disk); -2 refused: a producer is feeding
# the run; -3 refused: a collector holds its lock; -1 already retired. Once the summary is set,
# every write to the run is refused (accept, take, store, counters, the collector's lock), so
# nothing lands after it, even forced. UNLINK: a million-member set is freed in the
# background, not while Redis blocks.
RETIRE_RUN = (
    NOW_MS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
if ARGV[2] ~= '1' then
  if redis.call('ZCOUNT', KEYS[7], '(' .. now, '+inf') > 0 then return -2 end
  if redis.call('EXISTS', KEYS[8]) == 1 then return -3 end
  if (redis.call('SCARD', KEYS[2]) + redis.call('HLEN', KEYS[3])
      + redis.call('LLEN', KEYS[4]) + redis.call('LLEN', KEYS[5])
      + redis.call('HLEN', KEYS[6])) > 0 then
    return 0
  end
end
-- The figures are read here, in the same step as the keys go: they are what is on disk.
local summary = cjson.decode(ARGV[1])
summary.total = redis.call('SCARD', KEYS[9])
summary.written = tonumber(redis.call('HGET', KEYS[10], 'written') or '0')
summary.failed = redis.call('HLEN', KEYS[6])
summary.unfinished = summary.total - summary.written - summary.failed
summary.completion_tokens = tonumber(redis.call('HGET', KEYS[10], 'completion_tokens') or '0')
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
redis.call('SET', KEYS[1], cjson.encode(summary))
return 1
"""
)

# KEYS: lock, retired   ARGV: token, ttl_ms
# The collector's lock: taken if free, extended if ours (1), 0 held by another, -1 the run is
# retired (a collector left following it must not bring its keys back).
COLLECTOR_LOCK = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return 1 end
return 0
"""

# KEYS: lock   ARGV: token   (released only by its holder)
COLLECTOR_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: leases, lease_owner, reaped   returns the ids whose lease expired (their holder is
# gone, or paused). The holder's token is noted in ``reaped``: if it was only paused, its
# renewal takes the lease back while no one else has (LEASE_RENEW).
REAP_EXPIRED = (
    NOW_MS
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 1, #ids do
  local owner = redis.call('HGET', KEYS[2], ids[i])
  if owner then redis.call('HSET', KEYS[3], ids[i], owner) end
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

# -- a run's model (common/store/model_pin.py) -----------------------------------------------

# KEYS: meta, retired, refused endpoints   ARGV: model, endpoint, reason
# One model per run: the first model asked for is pinned in the run's meta (HSETNX: two
# workers racing on two servers pin one). Returns the pinned model; an endpoint serving
# another one is noted as refused for the run, with ``reason``. '' on a retired run.
PIN_MODEL = """
if redis.call('EXISTS', KEYS[2]) == 1 then return '' end
redis.call('HSETNX', KEYS[1], 'model', ARGV[1])
local pinned = redis.call('HGET', KEYS[1], 'model')
if pinned ~= ARGV[1] then redis.call('HSET', KEYS[3], ARGV[2], ARGV[3]) end
return pinned
"""

# -- worker bookkeeping (worker/clock_watch.py) ----------------------------------------------

# KEYS: clocks   ARGV: max age s   drops readings older than that (by Redis's clock): a worker
# that died without a clean stop (OOM kill, lost node) leaves one behind. Returns how many.
PRUNE_CLOCKS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', KEYS[1])
local dropped = 0
for i = 1, #all, 2 do
  local ok, reading = pcall(cjson.decode, all[i + 1])
  local at = ok and type(reading) == 'table' and tonumber(reading.at) or 0
  if at < now - tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[1], all[i])
    dropped = dropped + 1
  end
end
return dropped
"""

# -- a run's statistics (common/stats.py) ----------------------------------------------------

# KEYS: retired, then the hashes written   ARGV: groups of (op, key index, field, value):
# op 'i' HINCRBY, 'f' HINCRBYFLOAT, 's' HSET, 'e' EXPIRE (value in seconds; field unused).
# A batch of statistics, unless the run is retired (0): a worker flushing after the retire
# must not bring the run's keys back.
STATS_WRITE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 1, #ARGV, 4 do
  local op, key, name, value = ARGV[i], KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2], ARGV[i + 3]
  if op == 'i' then redis.call('HINCRBY', key, name, value)
  elseif op == 'f' then redis.call('HINCRBYFLOAT', key, name, value)
  elseif op == 's' then redis.call('HSET', key, name, value)
  else redis.call('EXPIRE', key, tonumber(value)) end
end
return 1
"""

# KEYS: meta, retired   ARGV: created_at, params json, queue ('' to leave it unset)
# A run's metadata, set once: returns {stored params, stored queue} (the caller compares them
# with its own), or -1 on a retired run (nothing written: a producer racing ``runs retire``
# must not bring the run's keys back).
ENSURE_RUN = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('HSETNX', KEYS[1], 'created_at', ARGV[1])
redis.call('HSETNX', KEYS[1], 'params', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[1], 'queue', ARGV[3]) end
local found = redis.call('HMGET', KEYS[1], 'params', 'queue')
return {found[1], found[2] or ''}
"""
