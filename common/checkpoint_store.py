"""The checkpoint half of a worker's store: answered turns and the turn in progress, saved
under the lease and read back.

The format (a header and an appended log) is common/checkpoint_log.py; every write is one
fenced script (``SAVE_PARTIAL``, ``SAVE_CHECKPOINT``): only the lease holder of a pending
sample may make it. Every way a sample's turn in progress ends drops its log with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import redis
from redis.commands.core import Script

from common import checkpoint_log, errors, lua
from common.keys import CHECKPOINT_SUFFIX, RunKeys
from common.models import Checkpoint, TurnResult


class CheckpointStore:
    """Checkpoints of one run's samples (``WorkerStore`` is one)."""

    r: redis.Redis
    keys: RunKeys
    _script: Callable[[str], Script]  # common/store/base.py

    def save_partial(self, sample_id: str, token: str, turns: list[TurnResult]) -> None:
        """Keep answered turns so a retry resumes at the first unanswered one; the
        checkpoint of the turn just answered (header and log) and its running request go with
        it (done: not to be continued, nothing to abort). Raises ``LeaseLost`` unless
        ``token`` holds the lease of a still pending sample."""
        k = self.keys
        payload = json.dumps([t.model_dump() for t in turns], ensure_ascii=False)
        written = self._script(lua.SAVE_PARTIAL)(
            keys=[k.pending, k.lease_owner, k.prompts, k.reaped, k.checkpoint_log(sample_id),
                  k.requests],
            args=[sample_id, token, k.partial_field(sample_id), payload,
                  k.checkpoint_field(sample_id)],
        )  # fmt: skip
        if not written:
            raise errors.LeaseLost(f"answered turns of {sample_id} refused: the lease is not ours")

    def save_checkpoint(
        self, sample_id: str, token: str, header: str, piece: str, log_bytes: int = 0
    ) -> int:
        """Keep the turn in progress while ``token`` holds the sample's lease: with a
        ``header``, the whole checkpoint again; without, ``piece`` appended to a log expected
        ``log_bytes`` long (common/checkpoint_log.py). Returns the log's length once written,
        0 refused (another worker holds the sample now, the lease was given back, or the
        sample is finished), -1 not appended (the log is not as expected: save it whole)."""
        k = self.keys
        return int(self._script(lua.SAVE_CHECKPOINT)(
            keys=[k.pending, k.lease_owner, k.prompts, k.checkpoint_log(sample_id), k.reaped],
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


def drop_checkpoint_logs(client: redis.Redis, keys: RunKeys) -> None:
    """Delete every checkpoint log of a run (a scan: when it is retired or deleted)."""
    for key in client.scan_iter(match=keys.checkpoint_logs, count=1000):
        client.unlink(key)
