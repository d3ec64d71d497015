"""Which endpoints serve a run's requests.

An endpoint that refuses the run's requests whatever the sample (``errors.EndpointRefused``: a
404 for the route or the model, a 401/403) is taken out of the run's rotation after
``OUT_AFTER`` such refusals in a row seen by one process (one 404 from a proxy whose backend
restarts does not cost a server for the whole run). It stays out for every worker (the run's
``endpoints_out`` in Redis, with the reason, shown by ``status`` and ``endpoints list``) until
``retry-failed``. An endpoint serving another model than the run's is out for this process
(``ModelPin`` notes it for ``status``).

What each process knows of the run's rotation is read again at most every ``REREAD_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from common.store import RunStore

log = logging.getLogger("eaglegen.worker")

OUT_AFTER = 3  # refusals in a row by one endpoint, for one run, seen by one process
REREAD_S = 2.0


class Rotation:
    """One process's view of the endpoints out of each run's rotation, and the rule that takes
    one out."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._shared: dict[str, tuple[float, frozenset[str]]] = {}  # run -> (read at, out)
        self._other_model: dict[str, frozenset[str]] = {}  # run -> endpoints on another model
        self._streaks: dict[tuple[str, str], int] = {}  # (run, endpoint) -> refusals in a row

    def out(self, store: RunStore, fresh: bool = False) -> frozenset[str]:
        """The endpoints not to send the run's requests to (``fresh``: read from Redis now)."""
        now = self._clock()
        with self._lock:
            seen = self._shared.get(store.run)
        if fresh or seen is None or now - seen[0] > REREAD_S:
            seen = (now, frozenset(store.endpoints_out()))
            with self._lock:
                self._shared[store.run] = seen
        with self._lock:
            return seen[1] | self._other_model.get(store.run, frozenset())

    def other_model(self, run: str, endpoint: str) -> None:
        """``endpoint`` serves another model than the run's: out for this process."""
        with self._lock:
            self._other_model[run] = self._other_model.get(run, frozenset()) | {endpoint}

    def answered(self, run: str, endpoint: str) -> None:
        """A request of the run was answered there: its refusals are no longer in a row."""
        with self._lock:
            self._streaks.pop((run, endpoint), None)

    def refused(self, store: RunStore, endpoint: str, why: str) -> None:
        """``endpoint`` refused a request of the run (``why``: the error, redacted); at the
        ``OUT_AFTER``-th refusal in a row it is taken out of the run's rotation."""
        key = (store.run, endpoint)
        with self._lock:
            self._streaks[key] = streak = self._streaks.get(key, 0) + 1
        if streak < OUT_AFTER:
            return
        # The endpoint is named beside the reason wherever it is shown: not again inside it.
        reason = f"refused {streak} requests in a row: {why.removeprefix(endpoint + ': ')}"[:300]
        if store.take_endpoint_out(endpoint, reason):
            log.warning("endpoint %s out of rotation for run %s: %s", endpoint, store.run, reason)
        with self._lock:
            self._shared.pop(store.run, None)  # read again before the next request
