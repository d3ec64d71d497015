"""A capture run's state in Redis: the generation run's keys and scripts, rows for samples.

A row moves exactly as a sample does (accepted -> pending -> leased -> done -> written, or
failed), through the same Lua scripts, so leases, the reconciler, retries, status counts and
the collector's fenced commit all work unchanged. What differs is held here: the run's
``CaptureSpec`` beside the generation parameters in the meta hash, a small ``RowRef`` in place
of a prompt, and the stored result is the row's manifest line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from capture.spec import CaptureSpec, RowRef
from common import lua
from common.errors import RunMismatch, RunRetired
from common.keys import runs_key
from common.store import ACCEPT_CHUNK, RunStore
from common.store.producer import PRODUCER_BEAT_S

SPEC_FIELD = "capture"
BYTES_COUNTER = "capture_bytes"


@dataclass(frozen=True)
class TakenRow:
    """A row's lease taken (or refused: 'done', 'leased'; or 'exhausted': the row failed)."""

    outcome: str
    attempts: int = 0
    ref: RowRef | None = None


class CaptureStore:
    """One capture run's state: a ``RunStore`` plus what only capture needs."""

    def __init__(self, client: redis.Redis, prefix: str, run: str) -> None:
        self.runs = RunStore(client, prefix, run)
        self.r = client
        self.run = run
        self.keys = self.runs.keys
        self._accept = client.register_script(lua.ACCEPT)

    def ensure_spec(self, spec: CaptureSpec, queue: str) -> None:
        """Record the run's spec and queue, or refuse a run that exists with other ones."""
        if (summary := self.runs.retired_summary()) is not None:
            raise RunRetired(f"run {self.run!r} is retired ({summary.get('written')} written)")
        meta = self.keys.meta
        if self.r.hget(meta, "params") is not None:
            raise RunMismatch(f"run {self.run!r} is a generation run; use a new --run")
        self.r.sadd(runs_key(self.runs.prefix), self.run)
        self.r.hsetnx(meta, "created_at", repr(time.time()))
        self.r.hsetnx(meta, "queue", queue)
        if (stored_queue := self.runs.queue()) != queue:
            raise RunMismatch(
                f"run {self.run!r} is served by queue {stored_queue!r}, not {queue!r}"
            )
        if self.r.hsetnx(meta, SPEC_FIELD, spec.model_dump_json()):
            return
        stored = self.spec()
        if stored is not None and stored != spec:
            raise RunMismatch(_mismatch(self.run, stored, spec))

    def spec(self) -> CaptureSpec | None:
        """The run's spec (None: not a capture run)."""
        raw = self.r.hget(self.keys.meta, SPEC_FIELD)
        return CaptureSpec.model_validate_json(str(raw)) if raw else None

    def accept(self, refs: list[RowRef]) -> list[bool]:
        """Rows new to the run become pending; True where new (row ids are the indices)."""
        k = self.keys
        fresh: list[bool] = []
        for start in range(0, len(refs), ACCEPT_CHUNK):
            # The generation script: it refuses a retired run and beats the producer's heart.
            args: list[str | int] = ["capture-enqueue", int(PRODUCER_BEAT_S * 1000)]
            for ref in refs[start : start + ACCEPT_CHUNK]:
                args += [str(ref.row), ref.model_dump_json()]
            flags = self._accept(
                keys=[k.accepted, k.pending, k.prompts, k.retired, k.producers], args=args
            )
            if flags == -1:
                raise RunRetired(f"run {self.run!r} was retired while rows were enqueued")
            fresh += [bool(x) for x in flags]
        return fresh

    def take(
        self, row_id: str, token: str, ttl_s: float, retries: int, ceiling: int = 0
    ) -> TakenRow:
        """The row's lease and its ref, in one round trip (the generation script, and its
        attempts ceiling: 'exhausted' has failed the row)."""
        reply = self.runs.lease_reply(row_id, token, ttl_s, retries, ceiling)
        if reply[0] != "ok":
            return TakenRow(str(reply[0]), int(reply[1]) if len(reply) > 1 else 0)
        ref = RowRef.model_validate_json(reply[2]) if reply[2] else None
        return TakenRow("ok", int(reply[1]), ref)

    def add_bytes(self, amount: int) -> None:
        """Bytes of files whose manifest line was stored (for ``status``)."""
        self.r.hincrby(self.keys.counters, BYTES_COUNTER, amount)

    def bytes_written(self) -> int:
        """Bytes of the run's stored files."""
        return int(self.r.hget(self.keys.counters, BYTES_COUNTER) or 0)


def _mismatch(run: str, stored: CaptureSpec, wanted: CaptureSpec) -> str:
    a, b = stored.model_dump(), wanted.model_dump()
    diff = [name for name in a if a[name] != b[name]]
    if "fingerprint" in diff or "rows" in diff:
        return (
            f"run {run!r} was enqueued from another tokenized dataset (its content changed); "
            "use a new --run"
        )
    return (
        f"run {run!r} was created with other capture settings ({', '.join(diff)}); use a new --run"
    )
