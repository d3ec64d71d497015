"""Hosts whose clocks disagree: a worker shifted by libfaketime (a real process, a real clock
offset as it reads it) is reported, and the reconciler judges on Redis's clock, not its own."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, child_env, wait_for
from tests.services import unavailable
from tests.stack import Stack

pytestmark = pytest.mark.faults  # make test-faults


def shifted_clock(offset: str) -> dict[str, str]:
    """Environment that moves a child's wall clock by ``offset`` (e.g. "+300s")."""
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not found:
        unavailable("libfaketime is not installed (Debian package faketime; see .ci/run)")
    # Monotonic time stays true: timeouts and sleeps behave, only the wall clock is off.
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _prompts(tmp: Path, n: int) -> Path:
    path = tmp / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"clock question {i}"}) + "\n" for i in range(n)))
    return path


def test_a_worker_whose_clock_is_off_warns_and_status_names_it(stack: Stack, tmp_path):
    stack.simulator()
    stack.enqueue(_prompts(tmp_path, 2))
    stack.worker(concurrency=2, **shifted_clock("+30s"))
    stack.worker(concurrency=2)  # a true clock: not named

    def reported() -> dict[str, float]:
        status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)
        return dict(status["clocks_off"])

    wait_for(lambda: len(reported()) == 1, 60, "status to name the shifted worker")
    [skew] = reported().values()
    assert 28 < skew < 32
    wait_for(lambda: "clock is +" in stack.procs.logs(20_000), 30, "the worker's warning")
    assert "run NTP" in stack.procs.run(["status"], {**stack.env, "COLUMNS": "160"}).stdout


def test_a_reconciler_ahead_of_redis_leaves_retries_waiting_out_their_backoff(
    stack: Stack, tmp_path
):
    # Every first attempt fails; its retry then waits up to 120 s in the worker (a Celery ETA).
    stack.simulator("--fail-first", "1")
    stack.env |= {"EAGLEGEN_BACKOFF_BASE": "120", "EAGLEGEN_BACKOFF_MAX": "120"}
    stack.worker(concurrency=4)
    stack.enqueue(_prompts(tmp_path, 6))
    wait_for(lambda: stack.store.counts().retries >= 6, 60, "six retries to be scheduled")

    # Ten minutes ahead: on its own clock every ETA is long past (and the grace too).
    env = child_env(stack.env, shifted_clock("+600s"))
    done = subprocess.run(
        [sys.executable, "-c", TWO_PASSES], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["republished", "0"], done.stdout
    assert stack.queued() == 0


# `eaglegen reconcile` in a process of its own; its wait between the two passes is an Event's,
# because libfaketime breaks time.sleep (EINVAL from clock_nanosleep) in the shifted process.
TWO_PASSES = """
import threading
from common.settings import Settings
from common.store import connect
from broker.app import create_broker_app
from worker.pipeline.reconcile import Reconciler
settings = Settings()
hand_back = create_broker_app(settings).publish_samples
reconciler = Reconciler(connect(settings.redis_url), settings, hand_back)
reconciler.run_once([settings.run])
threading.Event().wait(1.0)
print("republished", sum(len(r.republished) for r in reconciler.run_once([settings.run])))
"""
