"""The run's circuit breaker: once most of the samples attempted failed the same way, a way that
is neither the sample's own nor one endpoint's (the run's parameters refused, every endpoint
refusing its requests), the others are not sent to fail too; each is failed at once with the
reason, and ``retry-failed`` (with new parameters) closes the breaker again.

A sample's own error (a 400: its prompt over the context) fails that sample alone; an
endpoint's refusal takes that endpoint out of the run's rotation (``rotation.py``) and the
sample goes to another; neither opens the breaker. The state is one field of the run's meta
hash; a closed breaker is read again at most every ``REREAD_S`` per process, an open one
before every sample it fails.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from common import errors
from common.models import Failure
from common.store import RunStore

MIN_ATTEMPTED = 10  # samples attempted (answered or failed) before the rate means anything
TRIP_RATE = 0.9  # of them failed the run's way
SAMPLE = 50  # failures read (at random) to tell their kinds apart
REREAD_S = 2.0
FIELD = "breaker"


def _kinds(root: type[errors.GenerationError]) -> frozenset[str]:
    found, todo = set(), [root]
    while todo:
        cls = todo.pop()
        found.add(cls.kind)
        todo += cls.__subclasses__()
    return frozenset(found)


# Permanent failures that do not depend on the sample or on one endpoint.
RUNS_OWN = _kinds(errors.PermanentError) - _kinds(errors.BadRequest) - {
    errors.CircuitOpen.kind, errors.GenerationError.kind,
}  # fmt: skip


def trip_reason(store: RunStore) -> str | None:
    """Why the run's breaker is open (None: closed)."""
    raw = store.meta_value(FIELD)
    if not raw:
        return None
    data = json.loads(raw)
    attempted = data.get("attempted", data.get("after"))  # "after": opened by an older version
    return (
        f"not attempted: {data.get('failed', attempted)} of the run's {attempted} samples "
        f"attempted failed with {data['kind']} ({data['message']}); fix the cause, then "
        "`eaglegen retry-failed` (it takes new generation parameters, e.g. --max-tokens)"
    )


def reset(store: RunStore) -> None:
    """Close the breaker and bring every endpoint back into the run's rotation
    (``retry-failed`` does, before it requeues)."""
    store.drop_meta(FIELD)
    store.bring_endpoints_back()


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
        """A sample was failed: open the breaker if it failed the run's way and so did at
        least ``TRIP_RATE`` of the samples attempted (``MIN_ATTEMPTED`` or more), and more
        samples than are in flight (perhaps long generations that will succeed)."""
        if failure.kind not in RUNS_OWN:
            return
        with self._lock:  # the next sample reads the breaker afresh: it may open now
            self._seen.pop(store.run, None)
        failed, attempted, in_flight = _tally(store, failure)
        if attempted < MIN_ATTEMPTED or failed <= in_flight or failed < TRIP_RATE * attempted:
            return
        state = {"kind": failure.kind, "message": failure.message[:300], "failed": failed,
                 "attempted": attempted, "at": time.time()}  # fmt: skip
        store.set_meta_once(FIELD, json.dumps(state))


def _tally(store: RunStore, failure: Failure) -> tuple[int, int, int]:
    """Samples failed the run's way, samples attempted (answered, or failed other than by the
    open breaker), samples in flight; the kinds' shares from a random pick of the failures."""
    counts = store.counts()
    seen = store.some_failures(SAMPLE) or [failure]
    share = sum(f.kind in RUNS_OWN for f in seen) / len(seen)
    untried = sum(f.kind == errors.CircuitOpen.kind for f in seen) / len(seen)
    failed = round(counts.failed * share)
    return failed, counts.done + round(counts.failed * (1 - untried)), counts.in_flight
