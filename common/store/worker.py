"""What a worker may write to a run: its sample leases and, under them, a sample's progress.

Every write that changes a sample's progress (answered turns, checkpoint, result, failure,
release) is one script that checks the caller's lease token and that the sample is still
pending, so a worker that lost its lease (paused past it, cut off) cannot overwrite the work
of the one that took the sample over; a refusal is ``errors.LeaseLost`` at the caller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from common import checkpoint_log, lua
from common.checkpoint_store import CheckpointStore
from common.models import Checkpoint, Failure, Sample, TurnResult
from common.request_store import RequestStore
from common.store.model_pin import ModelPin

LeaseOutcome = Literal["ok", "done", "leased", "retired", "exhausted"]
StoreOutcome = Literal["stored", "duplicate", "lease_lost"]
_STORE_OUTCOMES: dict[int, StoreOutcome] = {1: "stored", 0: "duplicate", -1: "lease_lost"}


def exhausted_message(ceiling: int) -> str:
    """Why the take failed a sample: its reason in ``status`` and ``failed``."""
    return (
        f"its lease was taken {ceiling} times without an outcome (EAGLEGEN_MAX_ATTEMPTS, "
        "default 3 x (EAGLEGEN_MAX_RETRIES + 1)): its attempts end in a way that stores nothing"
    )


@dataclass(frozen=True)
class Taken:
    """A lease taken (or refused) and what generating the sample needs."""

    outcome: LeaseOutcome
    attempts: int = 0  # of an 'exhausted' take: those before it
    sample: Sample | None = None  # None: no stored prompt (a broken run)
    partial: list[TurnResult] = field(default_factory=list)
    # The turn an earlier attempt was generating when it stopped, as far as it got.
    checkpoint: Checkpoint | None = None

    def resume_point(self) -> Checkpoint | None:
        """The checkpoint, if it continues this very history: the next turn to answer, after
        the answers it was generated on (one taken after other answers is discarded)."""
        ckpt = self.checkpoint
        if ckpt is None or ckpt.turn != len(self.partial):
            return None
        return ckpt if ckpt.extends(self.partial) else None


class WorkerStore(ModelPin, CheckpointStore, RequestStore):
    """A sample's lease and the fenced writes of its holder."""

    def take(
        self, sample_id: str, owner: str, ttl_s: float, retries: int = 0, ceiling: int = 0
    ) -> Taken:
        """Take the lease on a sample and read what generating it needs, in one round trip.

        ``retries`` is the message's own retry count: attempts beyond it are redeliveries.
        ``ceiling``: takes allowed in all (0: no limit); past it the sample is failed here
        ('exhausted').
        """
        reply = self.lease_reply(sample_id, owner, ttl_s, retries, ceiling)
        if reply[0] != "ok":
            return Taken(reply[0], int(reply[1]) if len(reply) > 1 else 0)
        _, attempts, prompt, partial, ckpt = reply
        # The log is read only when there is a checkpoint to continue: rarely, after a break
        # (the lease is ours now: no one else may write it in between).
        log = str(self.r.get(self.keys.checkpoint_log(sample_id)) or "") if ckpt else None
        return Taken(
            "ok", int(attempts),
            Sample.model_validate_json(prompt) if prompt else None,
            [TurnResult.model_validate(t) for t in json.loads(partial)] if partial else [],
            checkpoint_log.decode(ckpt or "", log),
        )  # fmt: skip

    def lease_reply(
        self, sample_id: str, owner: str, ttl_s: float, retries: int, ceiling: int
    ) -> list[Any]:
        """LEASE_TAKE's own reply (capture reads its rows from it)."""
        k = self.keys
        reply: list[Any] = self._script(lua.LEASE_TAKE)(
            keys=[k.pending, k.leases, k.lease_owner, k.prompts, k.counters, k.reaped, k.retired,
                  k.failed, k.checkpoint_log(sample_id)],
            args=[sample_id, owner, int(ttl_s * 1000), retries, k.attempts_field(sample_id),
                  k.partial_field(sample_id), k.checkpoint_field(sample_id), ceiling,
                  exhausted_message(ceiling)],
        )  # fmt: skip
        return reply

    def acquire(self, sample_id: str, owner: str, ttl_s: float, retries: int = 0) -> LeaseOutcome:
        """Take the lease on a sample: 'ok', or why not ('done', 'leased', 'retired')."""
        return self.take(sample_id, owner, ttl_s, retries).outcome

    def renew(self, held: list[tuple[str, str]], ttl_s: float) -> list[str]:
        """Extend leases given as (id, owner); returns the ids no longer ours (taken by
        another worker, finished, or given back)."""
        if not held:
            return []
        args: list[str | int] = [int(ttl_s * 1000)]
        for sample_id, owner in held:
            args += [sample_id, owner]
        k = self.keys
        lost = self._script(lua.LEASE_RENEW)(
            keys=[k.leases, k.lease_owner, k.pending, k.reaped], args=args
        )
        return [str(x) for x in lost]

    def release(self, sample_id: str, owner: str) -> bool:
        """Give a lease back (before a retry waits out its backoff); False: not ours."""
        k = self.keys
        return bool(
            self._script(lua.LEASE_RELEASE)(
                keys=[k.leases, k.lease_owner, k.reaped], args=[sample_id, owner]
            )
        )

    def attempts(self, sample_id: str) -> int:
        """How many times workers started on the sample since it was last (re)queued."""
        return int(self.r.hget(self.keys.prompts, self.keys.attempts_field(sample_id)) or 0)

    def store_result(
        self, sample_id: str, record_json: str, completion_tokens: int, token: str
    ) -> StoreOutcome:
        """Store a finished record once and end our lease: 'stored', 'duplicate' (already
        finished) or 'lease_lost' (the lease is not ours: taken over, or reaped)."""
        k = self.keys
        keys = [k.pending, k.results, k.ready, k.leases, k.lease_owner, k.prompts, k.counters,
                k.reaped, k.checkpoint_log(sample_id), k.requests]  # fmt: skip
        args: list[str | int] = [
            sample_id, record_json, completion_tokens, token, k.attempts_field(sample_id),
            k.partial_field(sample_id), k.checkpoint_field(sample_id),
        ]  # fmt: skip
        return _STORE_OUTCOMES[int(self._script(lua.STORE_RESULT)(keys=keys, args=args))]

    def store_failure(self, sample_id: str, failure: Failure, token: str) -> StoreOutcome:
        """Move a sample to the failed set with its reason, under our lease."""
        k = self.keys
        ckpt_field = k.checkpoint_field(sample_id)
        keys = [k.pending, k.failed, k.leases, k.lease_owner, k.counters, k.prompts, k.reaped,
                k.checkpoint_log(sample_id), k.requests]  # fmt: skip
        outcome = self._script(lua.STORE_FAILURE)(
            keys=keys, args=[sample_id, failure.model_dump_json(), failure.kind, token, ckpt_field]
        )
        return _STORE_OUTCOMES[int(outcome)]

    def incr(self, counter: str, amount: int = 1) -> None:
        """Bump a run counter (retries, errors by class, wasted tokens); not on a retired run."""
        k = self.keys
        self._script(lua.INCR_COUNTER)(keys=[k.retired, k.counters], args=[counter, amount])
