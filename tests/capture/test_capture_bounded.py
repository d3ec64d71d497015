"""A capture server answering a shape no one expected fails its rows, each once, within their
retries: before, the exception (not in EagleGen's tree) left each row pending, re-published
by the reconciler with its retries at 0, for ever (44 attempts a row in 45 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture.spec import RowRef
from capture.store import CaptureStore
from tests.capture.conftest import ROWS, CaptureStack
from tests.harness import wait_for
from tests.hostile import HostileServer

pytestmark = pytest.mark.integration
RETRIES = 1


def test_a_completion_whose_choices_are_not_objects_fails_each_row_once(
    capture_stack: CaptureStack, tokenized: Path, tmp_path: Path
):
    server = HostileServer()
    try:
        out = tmp_path / "out"
        assert capture_stack.enqueue(tokenized, "odd", out, "speculators").returncode == 0
        capture_stack.worker(
            4, "--backend", "vllm", EAGLEGEN_ENDPOINTS=server.endpoint("completion-choices"),
            EAGLEGEN_MAX_RETRIES=str(RETRIES), EAGLEGEN_LEASE_TTL="2",
            EAGLEGEN_RECONCILE_INTERVAL="1",
        )  # fmt: skip
        store = capture_stack.store("odd").runs
        wait_for(
            lambda: store.counts().failed == ROWS and store.pending_count() == 0, 120,
            lambda: f"every row failed ({store.counts()})",
        )  # fmt: skip
    finally:
        server.close()
    failures = store.failures().values()
    # unexpected here; bad_response once the backend checks that shape itself
    assert {f.kind for f in failures} <= {"unexpected", "bad_response"}
    assert max(f.attempts for f in failures) <= RETRIES + 1
    counters = store.r.hgetall(store.keys.counters)
    assert sum(int(v) for k, v in counters.items() if k.startswith("failed:")) == ROWS


def test_a_row_taken_max_attempts_times_is_failed_by_the_take(rdb):
    store = CaptureStore(rdb, "eaglegen", "ceiling")
    store.accept([RowRef(row=0, tokens=5)])
    for n in (1, 2):
        taken = store.take("0", f"w{n}", 30, retries=0, ceiling=2)
        assert (taken.outcome, taken.attempts, taken.ref) == ("ok", n, RowRef(row=0, tokens=5))
        store.runs.release("0", f"w{n}")
    assert store.take("0", "w3", 30, retries=0, ceiling=2).outcome == "exhausted"
    failure = store.runs.failures()["0"]
    assert (failure.kind, failure.attempts) == ("attempts_exhausted", 2)
