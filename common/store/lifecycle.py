"""A run's end of life: failures sent round again, retiring (keys removed, a summary kept),
deleting."""

from __future__ import annotations

import json
import time
from typing import Literal

from common import lua
from common.checkpoint_store import drop_checkpoint_logs
from common.keys import (
    ATTEMPTS_SUFFIX,
    CHECKPOINT_SUFFIX,
    RESTARTED,
    retired_runs_key,
    runs_key,
)
from common.models import Sample
from common.store.status import StatusStore

RetireOutcome = Literal["retired", "unfinished", "producing", "collecting", "already"]
_RETIRE_OUTCOMES: dict[int, RetireOutcome] = {
    1: "retired", 0: "unfinished", -1: "already", -2: "producing", -3: "collecting",
}  # fmt: skip


class LifecycleStore(StatusStore):
    """Requeueing failures, retiring and deleting a run."""

    def requeue_failed(self, limit: int = 10_000_000) -> list[str]:
        """Move failed samples back to pending; returns their ids (to be published)."""
        k = self.keys
        moved = self._script(lua.REQUEUE_FAILED)(
            keys=[k.failed, k.pending, k.prompts], args=[limit, ATTEMPTS_SUFFIX, CHECKPOINT_SUFFIX]
        )
        return [str(x) for x in moved]

    def failed_samples(self, ids: list[str]) -> list[Sample | None]:
        """The stored prompts of failed samples (None where none is kept)."""
        if not ids:
            return []
        raw = self.r.hmget(self.keys.prompts, ids)
        return [Sample.model_validate_json(v) if v else None for v in raw]

    def replace_failed_samples(self, samples: list[Sample]) -> int:
        """Store new versions of failed samples' prompts (their own parameters) and drop what
        earlier attempts generated under the old ones: their answered turns and any
        checkpoint, so that each starts again from its first turn (a record holds one set of
        parameters, true for every turn). Returns the answered turns dropped."""
        if not samples:
            return 0
        k = self.keys
        fields = [k.partial_field(s.id) for s in samples]
        dropped = sum(len(json.loads(v)) for v in self.r.hmget(k.prompts, fields) if v)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(k.prompts, mapping={s.id: s.model_dump_json() for s in samples})
        pipe.hdel(k.prompts, *fields, *(k.checkpoint_field(s.id) for s in samples))
        pipe.delete(*(k.checkpoint_log(s.id) for s in samples))
        pipe.hincrby(k.counters, RESTARTED, len(samples))
        pipe.execute()
        return dropped

    def retire(self, force: bool = False) -> RetireOutcome:
        """Remove the run's keys and keep a small summary, if every sample is written, no
        producer feeds the run and no collector holds its lock (or ``force``). Once retired,
        every write to the run is refused inside Redis, so the summary stays equal to the
        file."""
        k = self.keys
        summary = self._summary(force)
        checked = [k.pending, k.results, k.ready, k.collecting, k.failed, k.producers,
                   k.collector_lock, k.accepted, k.counters]  # fmt: skip
        others = [key for key in k.all_keys() if key not in checked]
        keys = [k.retired, *checked, *others]
        code = int(self._script(lua.RETIRE_RUN)(keys=keys, args=[summary, int(force)]))
        outcome = _RETIRE_OUTCOMES[code]
        if outcome == "retired":
            drop_checkpoint_logs(self.r, k)  # of samples left unfinished (force)
        if outcome in ("retired", "already"):
            self.r.srem(runs_key(self.prefix), self.run)
            self.r.sadd(retired_runs_key(self.prefix), self.run)
        return outcome

    def _summary(self, force: bool) -> str:
        # The figures (total, written, failed...) are filled in by the script itself.
        meta = self.r.hgetall(self.keys.meta)
        created = meta.get("created_at")
        return json.dumps({
            "run": self.run, "created_at": float(created) if created else None,
            "retired_at": time.time(), "forced": force, "queue": meta.get("queue"),
            "model": meta.get("model"),
            "params": json.loads(meta["params"]) if meta.get("params") else None,
        })  # fmt: skip

    def delete(self) -> None:
        """Remove every key of the run."""
        self.r.delete(*self.keys.all_keys())
        drop_checkpoint_logs(self.r, self.keys)
        self.r.srem(runs_key(self.prefix), self.run)
