"""Generating one sample under its lease: the work behind each task message.

Pure generation logic (turns, history, the record) is in ``worker/generate.py``; HTTP and
routing are behind ``endpoints``; this module ties them to the sample's state in Redis.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import redis

from common import errors
from common.logs import secrets_of
from common.models import Failure, GenParams, Sample, TurnResult
from common.redact import redact
from common.settings import Settings
from common.store import RunStore, Taken
from worker.client import Messages
from worker.generate import answer_turns, build_record
from worker.leases import LeaseKeeper
from worker.observe import Observer
from worker.routing import RouteHint, hint_for

log = logging.getLogger("eaglegen.worker")
Check = Callable[[], None]


class TurnClient(Protocol):
    """What a borrowed endpoint client does: one assistant turn."""

    def complete(
        self, messages: Messages, params: GenParams, check: Check | None = None
    ) -> TurnResult:
        """Generate one turn."""
        ...


class Endpoints(Protocol):
    """Where requests go: a client for one request at a time, under the cluster-wide caps."""

    def borrow(
        self, check: Check | None = None, hint: RouteHint | None = None
    ) -> AbstractContextManager[TurnClient]:
        """A client of the endpoint chosen for one request (``hint``: where its prefix is)."""
        ...


class SampleProcessor:
    """Takes a sample's lease, answers its turns, stores the record or the failure."""

    def __init__(
        self, settings: Settings, store: Callable[[str], RunStore], endpoints: Endpoints,
        leases: LeaseKeeper, observer: Observer,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.store = store
        self.endpoints = endpoints
        self.leases = leases
        self.observer = observer
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._params: dict[str, GenParams] = {}
        self._drain_deadline: float | None = None

    def begin_drain(self) -> None:
        """SIGTERM: let in-flight generations finish within the grace time, then hand back."""
        self._drain_deadline = time.monotonic() + self.settings.shutdown_grace
        log.warning(
            "stopping: in-flight samples get %.0f s to finish, then go back to the queue",
            self.settings.shutdown_grace,
        )

    def params(self, run: str) -> GenParams:
        """The run's generation parameters (fixed for its life, so cached)."""
        if run not in self._params:
            found = self.store(run).params()
            if found is None:
                raise errors.PermanentError(f"run {run!r} has no parameters in Redis")
            self._params[run] = found
        return self._params[run]

    def process(self, run: str, sample_id: str, retries: int = 0) -> str:
        """Generate one sample under a lease; returns what happened (for the task's result).

        ``retries``: how often this message was retried (told apart from redeliveries).
        """
        if not self.leases.claim(run, sample_id):
            # A second message for a sample this very process is generating (redelivered
            # while it streams): one generation per process, the other one is acked.
            return "skipped:here"
        try:
            return self._under_lease(self.store(run), sample_id, retries)
        finally:
            self.leases.drop(run, sample_id)

    def _under_lease(self, store: RunStore, sample_id: str, retries: int) -> str:
        token = f"{self.owner}:{uuid.uuid4().hex[:8]}"
        taken = store.take(sample_id, token, self.settings.lease_ttl, retries)
        if taken.outcome != "ok":
            log.debug("skip %s/%s: %s", store.run, sample_id, taken.outcome)
            return f"skipped:{taken.outcome}"
        cancelled = self.leases.hold(store.run, sample_id, token)
        try:
            return self._generate(store, sample_id, taken, token, cancelled)
        except BaseException:
            # Storing the result ends the lease; any other way out gives it back here.
            store.release(sample_id, token)
            raise

    def fail(self, run: str, sample_id: str, exc: errors.GenerationError) -> None:
        """Record a sample as failed, with the error's class and message.

        Refused while another worker holds the sample's lease: that one may yet succeed.
        """
        store = self.store(run)
        # The reason is kept in Redis and shown by `status`; a server may quote the key back.
        message = redact(str(exc), secrets_of(self.settings))[:1000]
        failure = Failure(
            kind=exc.kind, message=message, attempts=store.attempts(sample_id), at=time.time()
        )
        if store.store_failure(sample_id, failure) == "lease_lost":
            log.info("not failing %s/%s: another worker is generating it", run, sample_id)
            return
        log.warning("failed %s/%s: %s", run, sample_id, failure.message)

    def count_retry(self, run: str) -> None:
        """A transient failure will be retried after its backoff."""
        self.store(run).incr("retries")

    def _generate(
        self, store: RunStore, sample_id: str, taken: Taken, token: str,
        cancelled: threading.Event,
    ) -> str:  # fmt: skip
        if taken.sample is None:
            raise errors.PermanentError(f"sample {sample_id} has no stored prompt")
        sample = taken.sample
        params = self.params(store.run)
        check = self._checker(sample_id, cancelled)
        answered = taken.partial
        hint = hint_for(sample, params, answered)  # the saved progress keeps the affinity

        def call(messages: Messages) -> TurnResult:
            nonlocal hint
            turn = self._call(store.run, messages, params, check, hint)
            hint = hint.after(turn.endpoint)
            return turn

        turns = answer_turns(
            sample, params, answered, call=call,
            save=lambda done: store.save_partial(sample_id, done),
        )  # fmt: skip
        return self._finish(store, sample, params, turns, token, taken.attempts)

    def _checker(self, sample_id: str, cancelled: threading.Event) -> Check:
        def check() -> None:
            if cancelled.is_set():
                raise errors.LeaseLost(f"lease on {sample_id} taken by another worker")
            if self._drain_deadline is not None and time.monotonic() > self._drain_deadline:
                raise errors.HandedBack(f"worker stopping; {sample_id} goes back to the queue")

        return check

    def _call(
        self, run: str, messages: Messages, params: GenParams, check: Check, hint: RouteHint
    ) -> TurnResult:
        try:
            with self.endpoints.borrow(check, hint) as client:
                turn = client.complete(messages, params, check)
        except errors.GenerationError as exc:
            self.observer.error(run, exc)
            raise
        self.observer.turn(run, turn)
        return turn

    def _finish(
        self, store: RunStore, sample: Sample, params: GenParams, turns: list[TurnResult],
        token: str, attempts: int,
    ) -> str:  # fmt: skip
        record = build_record(store.run, sample, params, turns, attempts)
        tokens = sum(t.usage.completion_tokens for t in turns)
        outcome = self._store(store, sample.id, record.to_json(), tokens, token)
        self.observer.finished(store.run, tokens, kept=outcome == "stored")
        log.debug(
            "sample run=%s id=%s outcome=%s turns=%d tokens=%d attempts=%d latency_s=%.2f",
            store.run, sample.id, outcome, len(turns), tokens, attempts,
            record.generation.latency_s,
        )  # fmt: skip
        return "done" if outcome == "stored" else outcome

    def _store(self, store: RunStore, sample_id: str, record: str, tokens: int, token: str) -> str:
        # A finished answer is worth minutes of GPU time: a Redis blip at this point is waited
        # out (the lease is still renewed meanwhile) rather than answered by regenerating.
        deadline = time.monotonic() + self.settings.store_retry_s
        pause = 0.5
        while True:
            try:
                return store.store_result(sample_id, record, tokens, token)
            except redis.RedisError as exc:
                if time.monotonic() + pause > deadline:
                    raise
                log.warning("storing %s/%s failed (%s); trying again", store.run, sample_id, exc)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
