"""What every role's view of a run shares: its keys, its scripts, its metadata.

Each role (producer, worker, reconciler, collector, status, retire) has its own class over
this base, holding only the writes that role may make; ``RunStore`` joins them for the tools
that act as several roles (the CLI, tests).
"""

from __future__ import annotations

import json
import time
from typing import NoReturn

import redis
from redis.commands.core import Script

from common import lua
from common.errors import RunMismatch, RunRetired
from common.keys import RunKeys, retired_runs_key, runs_key
from common.models import GenParams
from common.params import validated
from common.redis_url import is_sentinel, sentinel_master_client

# Explicit, whatever redis-py's default: no Redis command here may block for longer.
SOCKET_TIMEOUT_S = 10.0


class RunBase:
    """One run's keys and metadata in Redis; the role classes build on it."""

    def __init__(self, client: redis.Redis, prefix: str, run: str) -> None:
        self.r = client
        self.run = run
        self.prefix = prefix
        self.keys = RunKeys(prefix, run)
        self._scripts: dict[str, Script] = {}

    def _script(self, source: str) -> Script:
        """The registered handle of a script of common/lua/ (registered once per store)."""
        if source not in self._scripts:
            self._scripts[source] = self.r.register_script(source)
        return self._scripts[source]

    def ensure_params(self, params: GenParams, queue: str | None = None) -> None:
        """Record the run's parameters and queue, or fail if the run exists with other ones
        (or was retired)."""
        k = self.keys
        reply = self._script(lua.ENSURE_RUN)(
            keys=[k.meta, k.retired],
            args=[repr(time.time()), params.model_dump_json(), queue or ""],
        )
        if reply == -1:
            self._refuse_retired()
        self.r.sadd(runs_key(self.prefix), self.run)
        self._compare(str(reply[0]), str(reply[1]), params, queue)

    def check_params(self, params: GenParams, queue: str | None = None) -> None:
        """Fail as ``ensure_params`` would, writing nothing: a producer checks at its start
        and creates the run with its first sample, so that an enqueue that accepts nothing
        (every row too long, say) leaves no run frozen with its parameters."""
        if self.r.exists(self.keys.retired):
            self._refuse_retired()
        stored, stored_queue = self.r.hmget(self.keys.meta, ["params", "queue"])
        if stored:
            self._compare(str(stored), str(stored_queue or ""), params, queue)

    def _refuse_retired(self) -> NoReturn:
        summary = self.retired_summary()
        raise RunRetired(retired_line(self.run, summary or {}))

    def _compare(
        self, stored: str, stored_queue: str, params: GenParams, queue: str | None
    ) -> None:
        if queue is not None and stored_queue != queue:
            # A run is served by one queue's workers (and one endpoint set, one model): the
            # reconciler re-publishes its lost samples only there.
            raise RunMismatch(
                f"run {self.run!r} is served by queue {stored_queue!r}, not {queue!r}; "
                f"use EAGLEGEN_QUEUE={stored_queue} or a new --run"
            )
        stored_params = validated(GenParams, stored)
        if stored_params != params:
            diff = _describe_diff(stored_params, params)
            raise RunMismatch(
                f"run {self.run!r} was created with other parameters ({diff}); "
                "use the same ones or a new --run"
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

    def pending_count(self) -> int:
        """Samples accepted and not yet finished."""
        return int(self.r.scard(self.keys.pending))

    def exists(self) -> bool:
        """Whether the run was ever created."""
        return bool(self.r.exists(self.keys.meta))

    def retired_summary(self) -> dict[str, object] | None:
        """What is left of a retired run, or None if it is not retired."""
        raw = self.r.get(self.keys.retired)
        return json.loads(str(raw)) if raw else None


def known_runs(client: redis.Redis, prefix: str) -> list[str]:
    """Names of every run in this Redis."""
    return sorted(str(x) for x in client.smembers(runs_key(prefix)))


def retired_runs(client: redis.Redis, prefix: str) -> list[str]:
    """Names of every retired run in this Redis."""
    return sorted(str(x) for x in client.smembers(retired_runs_key(prefix)))


def retired_line(run: str, summary: dict[str, object]) -> str:
    """Why nothing can be added to a retired run, for the producer's error."""
    stamp = float(str(summary.get("retired_at") or time.time()))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
    return (
        f"run {run!r} was retired on {when} ({summary.get('written')} samples written, "
        f"{summary.get('failed')} failed); its ids are gone, so nothing can be added to it: "
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
