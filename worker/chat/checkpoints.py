"""Checkpoints of the turn in progress: when to save one, and saving it under the lease.

The client asks ``due(tokens)`` after every network read, so it must cost next to nothing:
an int compare, and a clock read every few calls. ``save`` appends what the turn generated since
the last save (common/checkpoint_log.py) with the fenced ``SAVE_CHECKPOINT`` script (only the
lease holder's write lands), marked with the answered history it extends; the first save of
the turn, or one whose log is not as this writer left it, writes it whole. A refusal means the
lease is not ours: the generation ends at once (``LeaseLost``), its tokens are another
worker's to make. A Redis error while saving one is only logged: a checkpoint is an
optimisation, and the generation goes on.
"""

from __future__ import annotations

import logging
import time

import redis

from common import checkpoint_log, errors
from common.models import Checkpoint, TurnResult
from common.settings import Settings
from common.store import WorkerStore

log = logging.getLogger("eaglegen.worker")
# The clock is read on every this-many-th ``due`` call (a power of two, for the mask).
CLOCK_EVERY = 4
# After a failed write, no periodic save for this long: a stalled Redis would otherwise hold
# the stream up to the command deadline on every save.
PAUSE_AFTER_ERROR_S = 30.0


class TurnCheckpoints:
    """The ``Progress`` of one turn of one sample, under one lease token."""

    def __init__(
        self, store: WorkerStore, sample_id: str, token: str, settings: Settings,
        resumed: Checkpoint | None = None, answered: list[TurnResult] | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.answered = list(answered or [])  # the history this turn is generated after
        self.sample_id = sample_id
        self.token = token
        self.every_tokens = settings.checkpoint_tokens
        self.every_s = settings.checkpoint_seconds
        self.saves = 0  # checkpoints written
        self.refused = False  # the lease is not ours any more: no more saves for this turn
        # A resumed turn counts from its checkpoint; whether the client counts the tokens of
        # the whole turn or of this request only, ``due`` re-bases on the first lower count.
        self._last_tokens = resumed.tokens if resumed is not None else 0
        self._next_time = time.monotonic() + self.every_s
        self._calls = 0
        self._paused = False  # after a failed write: nothing before ``_next_time``
        # What the log in Redis holds, as this writer left it (None: write the next one whole).
        self._saved: Checkpoint | None = None
        self._mark = checkpoint_log.Saved()

    def due(self, tokens: int) -> bool:
        """Whether a checkpoint is due with ``tokens`` generated (cheap: called per read)."""
        if self.refused:
            return False
        if tokens < self._last_tokens:
            self._last_tokens = 0
        if tokens - self._last_tokens >= self.every_tokens > 0 and not self._paused:
            return True
        self._calls += 1
        if self._calls & (CLOCK_EVERY - 1) or time.monotonic() < self._next_time:
            return False
        self._paused = False
        return tokens > self._last_tokens

    def save(self, checkpoint: Checkpoint) -> None:
        """Write a periodic checkpoint (Redis errors logged); raises ``LeaseLost`` when it is
        refused: the sample is not ours, every further token is wasted."""
        if not self.keep(checkpoint) and self.refused:
            raise errors.LeaseLost(f"checkpoint of {self.sample_id} refused: the lease is lost")

    def keep(self, checkpoint: Checkpoint) -> bool:
        """Write ``checkpoint`` under our lease; True if it landed. Tried even after a refusal
        (a reaped lease may have been renewed back since): the script is the fence."""
        self._last_tokens = checkpoint.tokens
        self._next_time = time.monotonic() + self.every_s
        try:
            written = self._write(checkpoint.on_history(self.answered))
        except redis.RedisError as exc:
            self._saved = None  # whether it landed is unknown
            self._next_time = time.monotonic() + max(self.every_s, PAUSE_AFTER_ERROR_S)
            self._paused = True
            log.warning(
                "checkpoint of %s/%s not saved (%s); generating on",
                self.store.run, self.sample_id, exc,
            )  # fmt: skip
            return False
        self.refused = not written
        if not written:
            # Another worker holds the sample (ours expired) or the lease was reaped.
            log.info("checkpoint of %s/%s refused: the lease is not ours", self.store.run,
                     self.sample_id)  # fmt: skip
            return False
        self.saves += 1
        return True

    def _write(self, checkpoint: Checkpoint) -> bool:
        """Append to the log, or write it whole; whether it landed (False: refused)."""
        store, sample_id, token = self.store, self.sample_id, self.token
        log_bytes = -1
        if self._saved is not None and checkpoint_log.extends(checkpoint, self._saved):
            piece = checkpoint_log.piece(checkpoint, self._mark)
            log_bytes = store.save_checkpoint(sample_id, token, "", piece, self._mark.log_bytes)
        if log_bytes == -1:
            piece = checkpoint_log.piece(checkpoint, checkpoint_log.Saved())
            head = checkpoint_log.header(checkpoint)
            log_bytes = store.save_checkpoint(sample_id, token, head, piece)
        self._saved = checkpoint if log_bytes > 0 else None
        self._mark = checkpoint_log.saved(checkpoint, log_bytes)
        return log_bytes > 0
