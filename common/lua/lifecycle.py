"""Scripts of a run's life beyond its samples: the collector's fenced lock and commits,
retiring, the pinned model, statistics, the run's metadata, workers' clock readings."""

from common.lua.clock import NOW_MS

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

# KEYS: retired, endpoints out   ARGV: endpoint, reason
# An endpoint refusing the run's requests is taken out of its rotation, once, with the reason
# of the first worker to do it. 1 if this call took it out; 0 if it was out, or the run retired.
TAKE_OUT_ENDPOINT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
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
