"""The run's circuit breaker: once its first samples all failed the same permanent way (a
400 for a too-long max_tokens, a model name the server does not know), the others are not
sent to fail too; each is failed at once with the reason, and ``retry-failed`` (with new
parameters) closes the breaker again.

The state is one field of the run's meta hash; a closed breaker is read again at most every
``REREAD_S`` per process, an open one before every sample it fails.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from common import errors
from common.models import Failure
from common.store import RunStore

TRIP_AFTER = 5  # permanent failures of one kind (and more than in flight), none answered
SAMPLE = 50  # failures read (at random) to see that they are all of one kind
REREAD_S = 2.0
FIELD = "breaker"


def _permanent_kinds() -> frozenset[str]:
    found, todo = set(), [errors.PermanentError]
    while todo:
        cls = todo.pop()
        found.add(cls.kind)
        todo += cls.__subclasses__()
    return frozenset(found - {errors.CircuitOpen.kind, errors.GenerationError.kind})


PERMANENT = _permanent_kinds()


def trip_reason(store: RunStore) -> str | None:
    """Why the run's breaker is open (None: closed)."""
    raw = store.meta_value(FIELD)
    if not raw:
        return None
    data = json.loads(raw)
    return (
        f"not attempted: the run's first {data['after']} samples all failed with "
        f"{data['kind']} ({data['message']}); fix the cause, then `eaglegen retry-failed` "
        "(it takes new generation parameters, e.g. --max-tokens)"
    )


def reset(store: RunStore) -> None:
    """Close the breaker (``retry-failed`` does, before it requeues)."""
    store.drop_meta(FIELD)


class Breaker:
    """One process's view of every run's breaker, and the rule that trips it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def check(self, store: RunStore) -> None:
        """Raise CircuitOpen if the run's breaker is open."""
        now = self._clock()
        with self._lock:
            cached = self._seen.get(store.run)
        # Only "closed" is kept for REREAD_S (a read saved per sample); "open" is read afresh
        # before it fails a sample, so a breaker that `retry-failed` just closed is seen at once.
        if cached is None or cached[1] is not None or now - cached[0] > REREAD_S:
            cached = (now, trip_reason(store))
            with self._lock:
                self._seen[store.run] = cached
        if cached[1] is not None:
            raise errors.CircuitOpen(cached[1])

    def failed(self, store: RunStore, failure: Failure) -> None:
        """A sample was failed: open the breaker if no sample of the run was answered and its
        failures, all permanent and of one kind, are ``TRIP_AFTER`` or more and more than the
        samples in flight."""
        if failure.kind not in PERMANENT:
            return
        with self._lock:  # the next sample reads the breaker afresh: it may open now
            self._seen.pop(store.run, None)
        counts = store.counts()
        # More failures than samples in flight: those in flight (perhaps long generations
        # that will succeed) cannot all be the next failures. A run whose first rows are bad
        # and whose answers take minutes is not judged by its fast-failing first rows.
        needed = max(TRIP_AFTER, counts.in_flight + 1)
        if counts.done > 0 or counts.failed < needed:
            return
        if {f.kind for f in store.some_failures(SAMPLE)} != {failure.kind}:
            return
        state = {"kind": failure.kind, "message": failure.message[:300], "after": counts.failed,
                 "at": time.time()}  # fmt: skip
        store.set_meta_once(FIELD, json.dumps(state))
