"""The checkpoint half of a run's store: the turn in progress, saved and read back.

The format (a header and an appended log) is common/checkpoint_log.py; the fenced write is
``SAVE_CHECKPOINT``. Every way a sample's turn in progress ends drops its log with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import redis
from redis.client import Pipeline

from common import checkpoint_log
from common.keys import CHECKPOINT_SUFFIX, RunKeys
from common.models import Checkpoint, TurnResult

StoreOutcome = Literal["stored", "duplicate", "lease_lost"]
_STORE_OUTCOMES: dict[int, StoreOutcome] = {1: "stored", 0: "duplicate", -1: "lease_lost"}


class CheckpointStore:
    """Checkpoints of one run's samples (``RunStore`` is one)."""

    r: redis.Redis
    keys: RunKeys
    _save_checkpoint: Any  # the registered SAVE_CHECKPOINT script

    def save_partial(self, sample_id: str, turns: list[TurnResult]) -> None:
        """Keep answered turns so a retry resumes at the first unanswered one.

        The checkpoint of the turn just answered goes in the same transaction: it is done,
        and a retry must not continue it again.
        """
        k = self.keys
        payload = json.dumps([t.model_dump() for t in turns], ensure_ascii=False)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(k.prompts, mapping={k.partial_field(sample_id): payload,
                                      k.checkpoint_field(sample_id): ""})  # fmt: skip
        pipe.delete(k.checkpoint_log(sample_id))
        pipe.hdel(k.requests, sample_id)  # the turn's request is over: nothing to abort
        pipe.execute()

    def save_checkpoint(
        self, sample_id: str, token: str, header: str, piece: str, log_bytes: int = 0
    ) -> int:
        """Keep the turn in progress while ``token`` holds the sample's lease: with a
        ``header``, the whole checkpoint again; without, ``piece`` appended to a log expected
        ``log_bytes`` long (common/checkpoint_log.py). Returns the log's length once written,
        0 refused (another worker holds the sample now, or the lease was reaped), -1 not
        appended (the log is not as expected: save it whole)."""
        k = self.keys
        return int(self._save_checkpoint(
            keys=[k.lease_owner, k.prompts, k.checkpoint_log(sample_id)],
            args=[sample_id, token, k.checkpoint_field(sample_id), header, piece, log_bytes],
        ))  # fmt: skip

    def checkpoint(self, sample_id: str) -> Checkpoint | None:
        """The sample's checkpoint, if one is kept (for tests and tools; workers get it with
        ``take``)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hget(self.keys.prompts, self.keys.checkpoint_field(sample_id))
        pipe.get(self.keys.checkpoint_log(sample_id))
        head, log = pipe.execute()
        return checkpoint_log.decode(head or "", log)

    def checkpoints(self) -> dict[str, Checkpoint]:
        """Every checkpoint the run keeps, by sample id (for tests and tools: a full scan)."""
        suffix = CHECKPOINT_SUFFIX
        ids = [str(f)[: -len(suffix)] for f, v in self.r.hscan_iter(self.keys.prompts)
               if str(f).endswith(suffix) and v]  # fmt: skip
        found = {i: self.checkpoint(i) for i in ids}
        return {i: c for i, c in found.items() if c is not None}

    def _ending(self, sample_id: str, script: Callable[[Pipeline], object]) -> StoreOutcome:
        """Run a script that ends the sample's turn in progress and drop its checkpoint log and
        running request in the same transaction. Also when refused: the holder then finds the
        log not as it left it and saves its checkpoint whole again."""
        pipe = self.r.pipeline(transaction=True)
        script(pipe)
        pipe.delete(self.keys.checkpoint_log(sample_id))
        pipe.hdel(self.keys.requests, sample_id)
        outcome, _, _ = pipe.execute()
        return _STORE_OUTCOMES[int(outcome)]

    def drop_checkpoint_logs(self) -> None:
        """Delete every checkpoint log of the run (a scan: when it is retired or deleted)."""
        for key in self.r.scan_iter(match=self.keys.checkpoint_logs, count=1000):
            self.r.unlink(key)
