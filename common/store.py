"""All run state in Redis: one class, atomic transitions as Lua scripts.

A sample moves accepted -> pending -> (leased while generating) -> done (result stored) ->
written (collector has it on disk), or -> failed. Every transition that touches more than one
key is one script, so a crash between two steps cannot leave a sample half-moved.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import redis

from common import checkpoint_log, errors, lua
from common.checkpoint_store import CheckpointStore, StoreOutcome
from common.errors import RunMismatch, RunRetired
from common.keys import ATTEMPTS_SUFFIX, CHECKPOINT_SUFFIX, RunKeys, retired_runs_key, runs_key
from common.locks import HeldLock
from common.models import Checkpoint, Failure, GenParams, Sample, TurnResult
from common.params import validated
from common.redis_url import is_sentinel, sentinel_master_client
from common.request_store import RequestStore

# Explicit, whatever redis-py's default: no Redis command here may block for longer.
SOCKET_TIMEOUT_S = 10.0
LeaseOutcome = Literal["ok", "done", "leased"]
RetireOutcome = Literal["retired", "unfinished", "already"]
_RETIRE_OUTCOMES: dict[int, RetireOutcome] = {1: "retired", 0: "unfinished", -1: "already"}


# Samples per ACCEPT call: Lua's unpack of a batch's ids has a stack limit.
ACCEPT_CHUNK = 1000


@dataclass(frozen=True)
class Taken:
    """A lease taken (or refused) and what generating the sample needs."""

    outcome: LeaseOutcome
    attempts: int = 0
    sample: Sample | None = None  # None: no stored prompt (a broken run)
    partial: list[TurnResult] = field(default_factory=list)
    # The turn an earlier attempt was generating when it stopped, as far as it got.
    checkpoint: Checkpoint | None = None

    def resume_point(self) -> Checkpoint | None:
        """The checkpoint, if it is of the next turn to answer (an older one is stale)."""
        ckpt = self.checkpoint
        return ckpt if ckpt is not None and ckpt.turn == len(self.partial) else None


@dataclass(frozen=True)
class RunCounts:
    """A run's progress; every figure is O(1) to read."""

    run: str
    total: int
    pending: int
    in_flight: int
    failed: int
    written: int
    completion_tokens: int
    retries: int
    redeliveries: int
    started_at: float | None

    @property
    def done(self) -> int:
        """Samples with a stored result (in Redis or already on disk)."""
        return self.total - self.pending - self.failed

    @property
    def queued(self) -> int:
        """Samples waiting for a worker."""
        return max(self.pending - self.in_flight, 0)

    @property
    def complete(self) -> bool:
        """Every sample is answered or failed, and every answer is on disk."""
        return self.done + self.failed == self.total and self.written == self.done

    def as_dict(self) -> dict[str, object]:
        """The JSON form of ``eaglegen status``."""
        return {
            "run": self.run, "total": self.total, "queued": self.queued,
            "in_flight": self.in_flight, "done": self.done, "failed": self.failed,
            "written": self.written, "complete": self.complete,
            "completion_tokens": self.completion_tokens, "retries": self.retries,
            "redeliveries": self.redeliveries,
            "started_at": self.started_at,
        }  # fmt: skip


class RunStore(CheckpointStore, RequestStore):
    """One run's state in Redis."""

    def __init__(self, client: redis.Redis, prefix: str, run: str) -> None:
        self.r = client
        self.run = run
        self.prefix = prefix
        self.keys = RunKeys(prefix, run)
        reg = client.register_script
        self._accept = reg(lua.ACCEPT)
        self._take = reg(lua.LEASE_TAKE)
        self._save_checkpoint = reg(lua.SAVE_CHECKPOINT)  # for CheckpointStore
        self._save_request = reg(lua.SAVE_REQUEST)  # for RequestStore
        self._pop_own_request = reg(lua.POP_OWN_REQUEST)
        self._renew = reg(lua.LEASE_RENEW)
        self._release = reg(lua.LEASE_RELEASE)
        self._store_result = reg(lua.STORE_RESULT)
        self._store_failure = reg(lua.STORE_FAILURE)
        self._requeue_failed = reg(lua.REQUEUE_FAILED)
        self._take_ready = reg(lua.TAKE_READY)
        self._commit_collected = reg(lua.COMMIT_COLLECTED)
        self._reap_expired = reg(lua.REAP_EXPIRED)
        self._requeue_result = reg(lua.REQUEUE_RESULT)
        self._count_expired = reg(lua.COUNT_EXPIRED)
        self._retire = reg(lua.RETIRE_RUN)

    # -- run metadata -------------------------------------------------------------------
    def ensure_params(self, params: GenParams, queue: str | None = None) -> None:
        """Record the run's parameters and queue, or fail if the run exists with other ones."""
        wanted = params.model_dump_json()
        if (summary := self.retired_summary()) is not None:
            raise RunRetired(_retired_line(self.run, summary))
        self.r.sadd(runs_key(self.prefix), self.run)
        self.r.hsetnx(self.keys.meta, "created_at", repr(time.time()))
        if queue is not None:
            self._ensure_queue(queue)
        if self.r.hsetnx(self.keys.meta, "params", wanted):
            return
        stored = validated(GenParams, str(self.r.hget(self.keys.meta, "params")))
        if stored != params:
            diff = _describe_diff(stored, params)
            raise RunMismatch(
                f"run {self.run!r} was created with other parameters ({diff}); "
                "use the same ones or a new --run"
            )

    def _ensure_queue(self, queue: str) -> None:
        # A run is served by one queue's workers (and one endpoint set, one model): the
        # reconciler re-publishes its lost samples only there.
        if self.r.hsetnx(self.keys.meta, "queue", queue):
            return
        if (stored := self.queue()) != queue:
            raise RunMismatch(
                f"run {self.run!r} is served by queue {stored!r}, not {queue!r}; "
                f"use EAGLEGEN_QUEUE={stored} or a new --run"
            )

    def queue(self) -> str | None:
        """The queue whose workers serve the run (None for runs made before it was kept)."""
        raw = self.r.hget(self.keys.meta, "queue")
        return str(raw) if raw else None

    def params(self) -> GenParams | None:
        """The run's parameters, if it exists."""
        raw = self.r.hget(self.keys.meta, "params")
        return validated(GenParams, str(raw)) if raw else None  # InvalidParams: one line

    def meta_value(self, name: str) -> str | None:
        """A field of the run's meta hash (the breaker's state, say)."""
        raw = self.r.hget(self.keys.meta, name)
        return str(raw) if raw else None

    def set_meta_once(self, name: str, value: str) -> bool:
        """Set a meta field unless it is set; True if this call set it."""
        return bool(self.r.hsetnx(self.keys.meta, name, value))

    def drop_meta(self, name: str) -> None:
        """Remove a meta field."""
        self.r.hdel(self.keys.meta, name)

    def exists(self) -> bool:
        """Whether the run was ever created."""
        return bool(self.r.exists(self.keys.meta))

    # -- producer -----------------------------------------------------------------------
    def known(self, ids: list[str]) -> list[bool]:
        """Which of ``ids`` the run has already accepted."""
        if not ids:
            return []
        return [bool(x) for x in self.r.smismember(self.keys.accepted, ids)]

    def accept(self, samples: list[Sample]) -> list[bool]:
        """Store new samples and mark them pending; True where the sample is new."""
        k = self.keys
        fresh: list[bool] = []
        for start in range(0, len(samples), ACCEPT_CHUNK):
            args: list[str] = []
            for s in samples[start : start + ACCEPT_CHUNK]:
                args += [s.id, s.model_dump_json()]
            flags = self._accept(keys=[k.accepted, k.pending, k.prompts], args=args)
            fresh += [bool(x) for x in flags]
        return fresh

    def pending_count(self) -> int:
        """Samples accepted and not yet finished."""
        return int(self.r.scard(self.keys.pending))

    # -- worker -------------------------------------------------------------------------
    def take(self, sample_id: str, owner: str, ttl_s: float, retries: int = 0) -> Taken:
        """Take the lease on a sample and read what generating it needs, in one round trip.

        ``retries`` is the message's own retry count: attempts beyond it are redeliveries.
        """
        k = self.keys
        reply = self._take(
            keys=[k.pending, k.leases, k.lease_owner, k.prompts, k.counters],
            args=[sample_id, owner, int(ttl_s * 1000), retries, k.attempts_field(sample_id),
                  k.partial_field(sample_id), k.checkpoint_field(sample_id)],
        )  # fmt: skip
        if reply[0] != "ok":
            return Taken(reply[0])
        _, attempts, prompt, partial, ckpt = reply
        # The log is read only when there is a checkpoint to continue: rarely, after a break.
        log = str(self.r.get(k.checkpoint_log(sample_id)) or "") if ckpt else None
        return Taken(
            "ok", int(attempts),
            Sample.model_validate_json(prompt) if prompt else None,
            [TurnResult.model_validate(t) for t in json.loads(partial)] if partial else [],
            checkpoint_log.decode(ckpt or "", log),
        )  # fmt: skip

    def acquire(self, sample_id: str, owner: str, ttl_s: float, retries: int = 0) -> LeaseOutcome:
        """Take the lease on a sample: 'ok', or why not ('done', 'leased')."""
        return self.take(sample_id, owner, ttl_s, retries).outcome

    def renew(self, held: list[tuple[str, str]], ttl_s: float) -> list[str]:
        """Extend leases given as (id, owner); returns the ids someone else now holds."""
        if not held:
            return []
        args: list[str | int] = [int(ttl_s * 1000)]
        for sample_id, owner in held:
            args += [sample_id, owner]
        k = self.keys
        lost = self._renew(keys=[k.leases, k.lease_owner, k.pending], args=args)
        return [str(x) for x in lost]

    def release(self, sample_id: str, owner: str) -> None:
        """Give a lease back (before a retry waits out its backoff)."""
        self._release(keys=[self.keys.leases, self.keys.lease_owner], args=[sample_id, owner])

    def attempts(self, sample_id: str) -> int:
        """How many times workers started on the sample since it was last (re)queued."""
        return int(self.r.hget(self.keys.prompts, self.keys.attempts_field(sample_id)) or 0)

    def store_result(
        self, sample_id: str, record_json: str, completion_tokens: int, token: str = ""
    ) -> StoreOutcome:
        """Store a finished record once and end our lease: 'stored', 'duplicate' (already
        finished) or 'lease_lost' (another worker holds the sample now; ours expired)."""
        k = self.keys
        keys = [k.pending, k.results, k.ready, k.leases, k.lease_owner, k.prompts, k.counters]
        args: list[str | int] = [
            sample_id, record_json, completion_tokens, token, k.attempts_field(sample_id),
            k.partial_field(sample_id), k.checkpoint_field(sample_id),
        ]  # fmt: skip
        return self._ending(sample_id, lambda pipe: self._store_result(keys=keys, args=args,
                                                                       client=pipe))  # fmt: skip

    def store_failure(self, sample_id: str, failure: Failure, token: str = "") -> StoreOutcome:
        """Move a sample to the failed set with its reason, unless another worker holds it."""
        k = self.keys
        ckpt_field = k.checkpoint_field(sample_id)
        return self._ending(sample_id, lambda pipe: self._store_failure(
            keys=[k.pending, k.failed, k.leases, k.lease_owner, k.counters, k.prompts],
            args=[sample_id, failure.model_dump_json(), failure.kind, token, ckpt_field],
            client=pipe,
        ))  # fmt: skip

    def incr(self, counter: str, amount: int = 1) -> None:
        """Bump a run counter (retries, errors by class, wasted tokens)."""
        self.r.hincrby(self.keys.counters, counter, amount)

    # -- reconciliation ---------------------------------------------------------------
    def reap_expired_leases(self) -> list[str]:
        """Drop leases whose holder stopped renewing them; returns those sample ids."""
        return [str(x) for x in self._reap_expired(keys=[self.keys.leases, self.keys.lease_owner])]

    def expired_lease_count(self) -> int:
        """Samples whose holder stopped renewing (dead or paused), not yet reaped."""
        return int(self._count_expired(keys=[self.keys.leases]))

    def pending_ids(self) -> set[str]:
        """Every pending id (bounded by the producer's max_pending)."""
        return {str(x) for x in self.r.sscan_iter(self.keys.pending, count=1000)}

    def still_pending(self, ids: set[str]) -> set[str]:
        """Those of ``ids`` that are still pending."""
        if not ids:
            return set()
        order = list(ids)
        flags = self.r.smismember(self.keys.pending, order)
        return {i for i, flag in zip(order, flags, strict=True) if flag}

    def leased_ids(self) -> set[str]:
        """Ids with a lease (live or not yet reaped)."""
        return {str(x) for x in self.r.zrange(self.keys.leases, 0, -1)}

    def orphan_results(self) -> list[str]:
        """Stored results that neither the ready nor the collecting list names."""
        k = self.keys
        if self.r.hlen(k.results) <= self.r.llen(k.ready) + self.r.llen(k.collecting):
            return []  # the common case, checked in O(1)
        listed = {str(x) for x in self.r.lrange(k.ready, 0, -1)}
        listed |= {str(x) for x in self.r.lrange(k.collecting, 0, -1)}
        return [str(i) for i in self.r.hkeys(k.results) if i not in listed]

    def requeue_result(self, sample_id: str) -> bool:
        """Put a stored result back on the collector's ready list."""
        k = self.keys
        return bool(self._requeue_result(keys=[k.pending, k.results, k.ready], args=[sample_id]))

    # -- failures -----------------------------------------------------------------------
    def failures(self) -> dict[str, Failure]:
        """Failed samples and why."""
        raw = self.r.hgetall(self.keys.failed)
        return {str(i): Failure.model_validate_json(str(v)) for i, v in raw.items()}

    def some_failures(self, count: int) -> list[Failure]:
        """Up to ``count`` failures picked at random (HRANDFIELD: O(count), whatever the run)."""
        flat = self.r.hrandfield(self.keys.failed, count, withvalues=True) or []
        return [Failure.model_validate_json(str(v)) for v in flat[1::2]]

    def failed_samples(self, ids: list[str]) -> list[Sample | None]:
        """The stored prompts of failed samples (None where none is kept)."""
        if not ids:
            return []
        raw = self.r.hmget(self.keys.prompts, ids)
        return [Sample.model_validate_json(v) if v else None for v in raw]

    def replace_failed_samples(self, samples: list[Sample]) -> None:
        """Store new versions of failed samples' prompts (their own parameters, say)."""
        if samples:
            self.r.hset(self.keys.prompts, mapping={s.id: s.model_dump_json() for s in samples})

    def requeue_failed(self, limit: int = 10_000_000) -> list[str]:
        """Move failed samples back to pending; returns their ids (to be published)."""
        k = self.keys
        moved = self._requeue_failed(
            keys=[k.failed, k.pending, k.prompts], args=[limit, ATTEMPTS_SUFFIX, CHECKPOINT_SUFFIX]
        )
        return [str(x) for x in moved]

    # -- collector ----------------------------------------------------------------------
    def take_ready(self, token: str, limit: int) -> list[str]:
        """Ids to write next, for the lock holder only: those a previous turn took and did not
        commit, else up to ``limit`` moved from the ready list to the collecting list."""
        k = self.keys
        taken = self._take_ready(
            keys=[k.collector_lock, k.ready, k.collecting], args=[token, limit]
        )
        if taken == -1:
            raise errors.CollectorFenced(f"run {self.run!r}: another collector holds the lock")
        return [str(x) for x in taken]

    def ready_count(self) -> int:
        """Results waiting for the collector."""
        return int(self.r.llen(self.keys.ready)) + int(self.r.llen(self.keys.collecting))

    def collecting(self) -> list[str]:
        """Ids taken by a collector that had not committed them (it crashed)."""
        return [str(x) for x in self.r.lrange(self.keys.collecting, 0, -1)]

    def results_for(self, ids: list[str]) -> list[str | None]:
        """Record JSON of each id (None where it is no longer in Redis)."""
        if not ids:
            return []
        return [None if v is None else str(v) for v in self.r.hmget(self.keys.results, ids)]

    def commit_collected(self, token: str, ids: list[str]) -> int:
        """After the lines are fsynced: drop those results from Redis and count them written."""
        k = self.keys
        keys = [k.collector_lock, k.collecting, k.results, k.counters]
        n = int(self._commit_collected(keys=keys, args=[token, *ids]))
        if n == -1:
            raise errors.CollectorFenced(f"run {self.run!r}: another collector holds the lock")
        return n

    def collector_lock(self, ttl_s: float) -> HeldLock:
        """The lock held by the one collector allowed to write this run."""
        return HeldLock(self.r, self.keys.collector_lock, ttl_s)

    # -- status -------------------------------------------------------------------------
    def counts(self) -> RunCounts:
        """Exact progress counters, read in one round trip."""
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        pipe.scard(k.accepted)
        pipe.scard(k.pending)
        pipe.zcard(k.leases)
        pipe.hlen(k.failed)
        pipe.hmget(k.counters, ["written", "completion_tokens", "retries", "redeliveries"])
        pipe.hget(k.meta, "created_at")
        total, pending, leased, failed, counters, created = pipe.execute()
        written, tokens, retries, redeliveries = (int(x or 0) for x in counters)
        return RunCounts(
            run=self.run, total=total, pending=pending, in_flight=min(leased, pending),
            failed=failed, written=written, completion_tokens=tokens, retries=retries,
            redeliveries=redeliveries,
            started_at=float(created) if created else None,
        )  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------
    def state(self, counts: RunCounts) -> str:
        """'retired', 'complete' (all answered or failed, answers on disk), 'collecting'
        (all answered, not all on disk), 'running' or 'empty'."""
        if self.r.exists(self.keys.retired):
            return "retired"
        if counts.total == 0:
            return "empty"
        if counts.complete:
            return "complete"
        return "collecting" if counts.pending == 0 else "running"

    def memory_bytes(self) -> int:
        """Redis memory the run's keys use (MEMORY USAGE; sampled for big sets and hashes)."""
        pipe = self.r.pipeline(transaction=False)
        for key in [*self.keys.all_keys(), self.keys.retired]:
            pipe.memory_usage(key)
        return sum(int(n) for n in pipe.execute() if n is not None)

    def retired_summary(self) -> dict[str, object] | None:
        """What is left of a retired run, or None if it is not retired."""
        raw = self.r.get(self.keys.retired)
        return json.loads(str(raw)) if raw else None

    def retire(self, force: bool = False) -> RetireOutcome:
        """Remove the run's keys and keep a small summary, if every sample is written (or
        ``force``). 'unfinished' when work is left: pending, unwritten or failed samples."""
        k = self.keys
        summary = self._summary(force)
        checked = [k.pending, k.results, k.ready, k.collecting, k.failed]
        others = [key for key in k.all_keys() if key not in checked]
        keys = [k.retired, *checked, *others]
        code = int(self._retire(keys=keys, args=[summary, int(force)]))
        outcome = _RETIRE_OUTCOMES[code]
        if outcome == "retired":
            self.drop_checkpoint_logs()  # of samples left unfinished (force)
        if outcome != "unfinished":
            self.r.srem(runs_key(self.prefix), self.run)
            self.r.sadd(retired_runs_key(self.prefix), self.run)
        return outcome

    def _summary(self, force: bool) -> str:
        counts = self.counts()
        meta = self.r.hgetall(self.keys.meta)
        return json.dumps({
            "run": self.run, "total": counts.total, "written": counts.written,
            "failed": counts.failed, "unfinished": counts.total - counts.written - counts.failed,
            "completion_tokens": counts.completion_tokens, "created_at": counts.started_at,
            "retired_at": time.time(), "forced": force, "queue": meta.get("queue"),
            "params": json.loads(meta["params"]) if meta.get("params") else None,
        })  # fmt: skip

    @staticmethod
    def retired_runs(client: redis.Redis, prefix: str) -> list[str]:
        """Names of every retired run in this Redis."""
        return sorted(str(x) for x in client.smembers(retired_runs_key(prefix)))

    @staticmethod
    def known_runs(client: redis.Redis, prefix: str) -> list[str]:
        """Names of every run in this Redis."""
        return sorted(str(x) for x in client.smembers(runs_key(prefix)))

    def delete(self) -> None:
        """Remove every key of the run."""
        self.r.delete(*self.keys.all_keys())
        self.drop_checkpoint_logs()
        self.r.srem(runs_key(self.prefix), self.run)


def _retired_line(run: str, summary: dict[str, object]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(str(summary["retired_at"]))))
    return (
        f"run {run!r} was retired on {when} ({summary['written']} samples written, "
        f"{summary['failed']} failed); its ids are gone, so nothing can be added to it: "
        "use a new --run"
    )


def _describe_diff(stored: GenParams, wanted: GenParams) -> str:
    a, b = stored.model_dump(), wanted.model_dump()
    return ", ".join(f"{name}: {a[name]!r} != {b[name]!r}" for name in a if a[name] != b[name])


def connect(url: str, sentinel_master: str | None = None) -> redis.Redis:
    """A Redis client that returns str and fails fast when the server is down or stalls.

    ``redis://`` and ``rediss://`` URLs (user, password, db, TLS ``ssl_*`` options) go to
    redis-py as they are; ``sentinel://`` asks the sentinels where ``sentinel_master`` is.
    Every command has a deadline (``SOCKET_TIMEOUT_S``): a half-open connection must not block
    a lease renewal while the process keeps generating under a lease it can no longer prove.
    """
    options = {
        "decode_responses": True, "socket_connect_timeout": 5, "socket_timeout": SOCKET_TIMEOUT_S,
        "health_check_interval": 30,
    }  # fmt: skip
    if is_sentinel(url):
        return sentinel_master_client(url, sentinel_master, **options)
    return redis.Redis.from_url(url, **options)


class RunStores:
    """One ``RunStore`` per run over one client, built on first use."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.r = client
        self.prefix = prefix
        self._stores: dict[str, RunStore] = {}
        self._lock = threading.Lock()

    def __call__(self, run: str) -> RunStore:
        with self._lock:
            if run not in self._stores:
                self._stores[run] = RunStore(self.r, self.prefix, run)
            return self._stores[run]
