"""Scripts of a run's samples: accepting them, their leases, and every write of their
progress, fenced by the lease token (common/store/producer.py, worker.py, reconcile.py)."""

from common.lua.clock import NOW_MS

# -- a run's samples (common/store/) ----------------------------------------------------------

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

# KEYS: pending, leases, lease_owner, prompts, counters, reaped, retired, failed, checkpoint log
# ARGV: id, owner, ttl_ms, retries, attempts field, partial field, checkpoint field, ceiling
#       (0: none), failure message
# Everything a worker needs to start on a sample, in one call: the lease, the attempt count,
# the prompt, the turns answered by earlier attempts and the checkpoint of the turn they were
# on. Returns {'ok', attempts, prompt, partial, checkpoint} (nil or empty when absent), or
# {'done'} / {'leased'} / {'retired'}, or {'exhausted', attempts}: taken ``ceiling`` times
# already, whatever ended those takes (a defect looping, workers dying on it), the sample is
# failed here as STORE_FAILURE fails it (prompt and answered turns kept for retry-failed).
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
local taken = tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0')
if tonumber(ARGV[8]) > 0 and taken >= tonumber(ARGV[8]) then
  local failure = {kind = 'attempts_exhausted', message = ARGV[9], attempts = taken,
                   at = now / 1000}
  redis.call('SREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[8], ARGV[1], cjson.encode(failure))
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[7])
  redis.call('DEL', KEYS[9])
  redis.call('HINCRBY', KEYS[5], 'failed:attempts_exhausted', 1)
  return {'exhausted', taken}
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

# KEYS: pending, lease_owner, prompts, reaped, checkpoint log, requests
# ARGV: id, token, partial field, turns json, checkpoint field
# The turns answered so far, for the lease holder of a pending sample only (1, else 0). The
# checkpoint of the turn just answered (header and log) is emptied with it: it is done, not to
# be continued; so is its running request (nothing left to abort).
SAVE_PARTIAL = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 0 end
if not is_holder(KEYS[2], KEYS[4], ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4], ARGV[5], '')
redis.call('DEL', KEYS[5])
redis.call('HDEL', KEYS[6], ARGV[1])
return 1
"""
)

# KEYS: pending, results, ready, leases, lease_owner, prompts, counters, reaped,
#       checkpoint log, requests
# ARGV: id, record json, completion tokens, token, attempts field, partial field,
#       checkpoint field
# A sample's whole finish: 1 stored, 0 already finished, -1 refused: the lease is not ours
# (another worker holds it, or it was given back). Our lease ends here but in the last case.
# The checkpoint log and running request go with a finished sample; a refusal leaves them to
# the worker holding it now.
STORE_RESULT = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  if redis.call('HGET', KEYS[5], ARGV[1]) == ARGV[4] then
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('HDEL', KEYS[5], ARGV[1])
  end
  redis.call('DEL', KEYS[9])
  redis.call('HDEL', KEYS[10], ARGV[1])
  return 0
end
if not is_holder(KEYS[5], KEYS[8], ARGV[1], ARGV[4]) then return -1 end
redis.call('DEL', KEYS[9])
redis.call('HDEL', KEYS[10], ARGV[1])
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

# KEYS: pending, failed, leases, lease_owner, counters, prompts, reaped, checkpoint log,
#       requests
# ARGV: id, failure json, kind, token, checkpoint field
# For the lease holder only (-1 otherwise: another worker may yet succeed); 0 already
# finished. The prompt and answered turns stay (``requeue failed`` runs the sample again); the
# checkpoint (header and log) goes: the failure may be the continuation itself (a server
# refusing the token-id prompt); so does the running request.
STORE_FAILURE = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  redis.call('DEL', KEYS[8])
  redis.call('HDEL', KEYS[9], ARGV[1])
  return 0
end
if not is_holder(KEYS[4], KEYS[7], ARGV[1], ARGV[4]) then return -1 end
redis.call('DEL', KEYS[8])
redis.call('HDEL', KEYS[9], ARGV[1])
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

# KEYS: pending, lease_owner, prompts, checkpoint log, reaped
# ARGV: id, token, checkpoint field, header ('' to append), piece, log length expected
# Fenced: written only for the lease holder of a pending sample (IS_HOLDER). A worker paused
# past its lease (SIGSTOP, a VM freeze) wakes up unable to overwrite the checkpoint of the
# worker that took the sample over; a lease reaped from it and not taken since is still its
# own, so its newer progress is kept. With a header, the checkpoint starts again: header and
# log replaced (common/checkpoint_log.py). Without one the piece is appended, only if the log
# is as long as its writer last left it and its header is still there (else something else
# wrote or cleared it since). Returns the log's length in bytes once written, 0 refused (not
# the lease holder), -1 not appended (the caller saves it whole).
SAVE_CHECKPOINT = (
    IS_HOLDER
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 0 end
if not is_holder(KEYS[2], KEYS[5], ARGV[1], ARGV[2]) then return 0 end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
  redis.call('SET', KEYS[4], ARGV[5])
  return redis.call('STRLEN', KEYS[4])
end
local head = redis.call('HGET', KEYS[3], ARGV[3])
if not head or head == '' or redis.call('STRLEN', KEYS[4]) ~= tonumber(ARGV[6]) then
  return -1
end
return redis.call('APPEND', KEYS[4], ARGV[5])
"""
)

# KEYS: lease_owner, requests, reaped   ARGV: id, token, request json
# The request a lease holder has running, kept for whoever takes the lease over (it aborts it
# on the server). Fenced like a checkpoint: a worker paused past its lease cannot name its
# stale request as the sample's current one. Returns 1 written, 0 refused.
SAVE_REQUEST = (
    IS_HOLDER
    + """
if not is_holder(KEYS[1], KEYS[3], ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""
)

# KEYS: requests   ARGV: id, token   returns the sample's running request if ``token`` sent
# it (and removes it), else nil: a request someone else already popped is theirs to abort.
POP_OWN_REQUEST = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw or cjson.decode(raw)['token'] ~= ARGV[2] then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
return raw
"""

# KEYS: leases, lease_owner, reaped   returns {id1, holder1, id2, holder2...}: the leases that
# expired (their holder is gone, or paused) and each one's holder token ('' if none). The
# holder's token is noted in ``reaped``: if it was only paused, its renewal takes the lease
# back while no one else has (LEASE_RENEW); the reaper aborts that holder's request only.
REAP_EXPIRED = (
    NOW_MS
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
for i = 1, #ids do
  local owner = redis.call('HGET', KEYS[2], ids[i])
  if owner then redis.call('HSET', KEYS[3], ids[i], owner) end
  redis.call('ZREM', KEYS[1], ids[i])
  redis.call('HDEL', KEYS[2], ids[i])
  out[#out + 1] = ids[i]
  out[#out + 1] = owner or ''
end
return out
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
