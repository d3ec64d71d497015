"""What ``status``, ``runs`` and the metrics read of a run: exact counters, state, footprint."""

from __future__ import annotations

from dataclasses import dataclass

from common.models import Failure
from common.store.base import RunBase


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


class StatusStore(RunBase):
    """Read-only views of a run."""

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

    def failures(self) -> dict[str, Failure]:
        """Failed samples and why."""
        raw = self.r.hgetall(self.keys.failed)
        return {str(i): Failure.model_validate_json(str(v)) for i, v in raw.items()}

    def some_failures(self, count: int) -> list[Failure]:
        """Up to ``count`` failures picked at random (HRANDFIELD: O(count), whatever the run)."""
        flat = self.r.hrandfield(self.keys.failed, count, withvalues=True) or []
        return [Failure.model_validate_json(str(v)) for v in flat[1::2]]

    def refused_endpoints(self) -> dict[str, str]:
        """Endpoints refused for the run (they serve another model) and why."""
        return {str(e): str(why) for e, why in self.r.hgetall(self.keys.refused_endpoints).items()}
