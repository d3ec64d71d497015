"""Capturing one row under its lease: the work behind each capture task message.

The row's states come from the batcher (one forward pass for many rows) or, with the vLLM
backend, from a capture server; its file is written atomically, and its manifest line is
stored with the generation store's script, which ends the lease; the manifest writer then
appends it. A worker killed at any point leaves at most a temporary file, and the row runs
again once its lease expires.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from capture.batcher import Runner
from capture.checks import check_states
from capture.files import Written, write_atomic
from capture.identity import ModelIdentity
from capture.layers import LayerPlan, plan
from capture.layouts import encode, relative_path, written_by
from capture.rows import Rows
from capture.spec import CaptureSpec, ManifestLine
from capture.store import CaptureStore
from common import errors
from common.logs import secrets_of
from common.models import Failure
from common.redact import redact
from common.settings import Settings
from common.stats import StatsRecorder
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.processing import end_attempt

log = logging.getLogger("eaglegen.capture")


class RunView:
    """What a process keeps of a capture run: its spec, rows, layers and statistics."""

    def __init__(
        self, store: CaptureStore, layers: int, model: ModelIdentity | None = None
    ) -> None:
        spec = store.spec()
        if spec is None:
            raise errors.PermanentError(f"run {store.run!r} is not a capture run")
        if spec.model is not None and model is not None and (why := spec.model.differs(model)):
            worker = f"{socket.gethostname()}:{os.getpid()}"
            store.refuse(worker, why)
            raise errors.WrongModel(f"run {store.run!r} refused by {worker}: {why}")
        self.spec: CaptureSpec = spec
        self.store = store
        self.rows = Rows(Path(spec.tokenized_dir))
        self.plan: LayerPlan = plan(spec.layout, layers, spec.aux_layers)
        self.out_dir = Path(spec.out_dir)
        self.stats = StatsRecorder(store.r, store.keys, [])


class RowProcessor:
    """Takes a row's lease, captures its states, writes its file, stores its manifest line."""

    def __init__(
        self, views: Callable[[str], RunView], batcher: Runner, leases: LeaseKeeper,
        settings: Settings,
    ) -> None:  # fmt: skip
        self.views = views
        self.batcher = batcher
        self.leases = leases
        self.settings = settings
        self.lease_ttl = settings.lease_ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._secrets = secrets_of(settings)
        self._stopping = threading.Event()

    def hand_back_all(self, hand_back: Callable[[str, list[str]], object]) -> None:
        """SIGTERM: every row held goes back to the queue now (a forward pass under way is
        not written: its lease is released and its work told to stop); rows taken later are
        handed back unstarted."""
        self._stopping.set()
        by_run: dict[str, list[str]] = {}
        for run, row_id, token in self.leases.held():
            self.leases.cancel(run, row_id)
            if self.views(run).store.runs.release(row_id, token):
                by_run.setdefault(run, []).append(row_id)
        for run, ids in by_run.items():
            hand_back(run, ids)
            log.warning("stopping: %d rows of %s handed back to the queue", len(ids), run)

    def process(self, run: str, row_id: str, retries: int = 0) -> str:
        """Capture one row; returns what happened (the task's result)."""
        if self._stopping.is_set():
            raise errors.HandedBack(f"worker stopping; row {row_id} goes back to the queue")
        if not self.leases.claim(run, row_id):
            return "skipped:here"
        try:
            return self._under_lease(self.views(run), row_id, retries)
        finally:
            self.leases.drop(run, row_id)

    def _under_lease(self, view: RunView, row_id: str, retries: int) -> str:
        token = f"{self.owner}:{uuid.uuid4().hex[:8]}"
        ceiling = self.settings.attempts_ceiling()
        taken = view.store.take(row_id, token, self.lease_ttl, retries, ceiling)
        if taken.outcome == "exhausted":
            log.warning("failed %s/%s: attempts_exhausted", view.store.run, row_id)
            return "failed:attempts_exhausted"
        if taken.outcome != "ok":
            return f"skipped:{taken.outcome}"
        cancelled = self.leases.hold(view.store.run, row_id, token)
        try:
            return self._capture(view, row_id, token, cancelled)
        except Exception as exc:
            # A final failure, whatever raised it, is stored by the lease's holder, fenced like
            # every other write.
            known = end_attempt(
                exc, retries, self.settings, self._secrets,
                fail=lambda e: self._fail(view, row_id, token, e, taken.attempts),
                release=lambda: view.store.runs.release(row_id, token),
            )  # fmt: skip
            if known is exc:
                raise
            raise known from exc
        except BaseException:
            view.store.runs.release(row_id, token)
            raise

    def _capture(self, view: RunView, row_id: str, token: str, cancelled: threading.Event) -> str:
        row = view.rows[int(row_id)]
        states = self.batcher.run(row.input_ids, view.plan.aux)
        check_states(states, len(row.input_ids))  # a server's zeros or short rows: not written
        if cancelled.is_set():
            raise errors.LeaseLost(f"lease on row {row_id} taken by another worker")
        spec, run = view.spec, view.store.run
        rel = relative_path(spec.layout, row.index)
        data = encode(spec.layout, row, states, run)

        def still_held() -> bool:  # asked of Redis, not of the renewer (it may be behind)
            return not cancelled.is_set() and not view.store.runs.renew(
                [(row_id, token)], self.lease_ttl
            )

        written = _write(view.out_dir / rel, data, spec, run, still_held)
        line = ManifestLine(
            id=row_id, run=run, row=row.index, sample=row.sample, file=rel,
            tokens=len(row.input_ids), bytes=written.bytes, sha256=written.sha256,
        )  # fmt: skip
        outcome = view.store.runs.store_result(row_id, line.to_json(), line.tokens, token)
        if outcome == "stored":
            view.store.add_bytes(written.bytes)
        view.stats.finished(line.tokens, kept=outcome == "stored")
        return "done" if outcome == "stored" else outcome

    def _fail(
        self, view: RunView, row_id: str, token: str, exc: errors.GenerationError, attempts: int
    ) -> None:
        """Record a row as failed with its reason, under our lease."""
        # Shown by `status`; a capture server may quote the key back.
        message = redact(str(exc), self._secrets)[:1000]
        failure = Failure(kind=exc.kind, message=message, attempts=attempts, at=time.time())
        if view.store.runs.store_failure(row_id, failure, token) != "lease_lost":
            log.warning("failed %s/%s: %s", view.store.run, row_id, failure.message)

    def count_retry(self, run: str) -> None:
        """A transient failure will be retried after its backoff."""
        self.views(run).store.runs.incr("retries")


def _write(
    path: Path, data: bytes, spec: CaptureSpec, run: str, still_held: Callable[[], bool]
) -> Written:
    # A file already at the path is replaced only if this run wrote it (an earlier attempt).
    return write_atomic(path, data, lambda p: written_by(p, spec.layout) == run, still_held)
