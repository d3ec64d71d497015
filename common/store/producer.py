"""What a producer may write to a run: new samples, and its heartbeat while it feeds them."""

from __future__ import annotations

from common import lua
from common.errors import RunRetired
from common.models import Sample
from common.store.base import RunBase

# Samples per ACCEPT call: Lua's unpack of a batch's ids has a stack limit.
ACCEPT_CHUNK = 1000
# A producer's heartbeat outlives it by this much: long enough for a slow source between two
# batches, short enough that ``runs retire`` after a killed producer waits little.
PRODUCER_BEAT_S = 30.0


class ProducerStore(RunBase):
    """Accepting samples into a run, under a heartbeat that ``runs retire`` respects."""

    def known(self, ids: list[str]) -> list[bool]:
        """Which of ``ids`` the run has already accepted."""
        if not ids:
            return []
        return [bool(x) for x in self.r.smismember(self.keys.accepted, ids)]

    def accept(self, samples: list[Sample], producer: str = "") -> list[bool]:
        """Store new samples and mark them pending; True where the sample is new. Raises
        ``RunRetired`` if the run was retired meanwhile (nothing is stored then)."""
        k = self.keys
        fresh: list[bool] = []
        beat_ms = int(PRODUCER_BEAT_S * 1000)
        for start in range(0, len(samples), ACCEPT_CHUNK):
            args: list[str | int] = [producer or "anonymous", beat_ms]
            for s in samples[start : start + ACCEPT_CHUNK]:
                args += [s.id, s.model_dump_json()]
            flags = self._script(lua.ACCEPT)(
                keys=[k.accepted, k.pending, k.prompts, k.retired, k.producers], args=args
            )
            if flags == -1:
                raise RunRetired(f"run {self.run!r} was retired while this producer fed it")
            fresh += [bool(x) for x in flags]
        return fresh

    def beat(self, producer: str, alive: bool = True) -> None:
        """Say the producer is still feeding the run (``alive``) or has stopped."""
        k = self.keys
        ttl_ms = int(PRODUCER_BEAT_S * 1000) if alive else 0
        code = self._script(lua.PRODUCER_BEAT)(
            keys=[k.retired, k.producers], args=[producer, ttl_ms]
        )
        if code == -1:
            raise RunRetired(f"run {self.run!r} was retired while this producer fed it")
