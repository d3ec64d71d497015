"""Capture under faults: workers killed or paused mid-batch, Redis restarted, a full disk.

Each run must end with every row in the manifest exactly once, each listed file whole (its
size and checksum), and no temporary file counted.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from capture.files import stale_temporaries
from tests.capture.conftest import CaptureStack, check_manifest, manifest
from tests.capture.helpers import make_rows, write_tokenized
from tests.harness import Procs, free_port, start_redis, wait_for
from tests.services import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.faults]
LEASE_TTL = 6.0
RECONCILE = 2.0


def _owners(stack: CaptureStack, run: str) -> dict[str, str]:
    return stack.store(run).r.hgetall(stack.store(run).keys.lease_owner)


def _held_by(stack: CaptureStack, run: str, pid: int) -> set[str]:
    return {row for row, owner in _owners(stack, run).items() if f":{pid}:" in owner}


def test_a_killed_and_a_paused_worker_lose_no_row_and_write_none_twice(
    capture_stack: CaptureStack, model_dir: Path, tmp_path: Path
):
    rows = make_rows(80, seed=3, low=100, high=300)  # batches long enough to be caught in
    tokenized = write_tokenized(tmp_path / "tok", rows, model_dir)
    out = tmp_path / "out"
    capture_stack.env["EAGLEGEN_LEASE_TTL"] = str(LEASE_TTL)
    capture_stack.env["EAGLEGEN_RECONCILE_INTERVAL"] = str(RECONCILE)
    assert capture_stack.enqueue(tokenized, "f", out, "speculators").returncode == 0
    killed = capture_stack.worker(concurrency=4)
    paused = capture_stack.worker(concurrency=4)

    def both_busy() -> bool:
        return bool(
            _held_by(capture_stack, "f", killed.pid) and _held_by(capture_stack, "f", paused.pid)
        )

    wait_for(both_busy, 240, lambda: f"both busy\n{capture_stack.procs.logs()}", every=0.05)
    lost = _held_by(capture_stack, "f", killed.pid)
    capture_stack.procs.kill(killed)
    paused.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    frozen = _held_by(capture_stack, "f", paused.pid)
    capture_stack.worker(concurrency=4)  # the survivor
    store = capture_stack.store("f")

    def taken_over() -> bool:
        pending = store.runs.still_pending(lost | frozen)
        return not pending

    # Within lease + one reconciler pass (+ the survivor's start-up and its batches on a
    # shared 2-core machine), never Celery's visibility timeout (over an hour here).
    wait_for(taken_over, 240, lambda: f"the rows to run again\n{capture_stack.procs.logs()}")
    took = time.monotonic() - stopped_at
    paused.send_signal(signal.SIGCONT)  # wakes with its rows done by another: must not add them
    capture_stack.wait_complete("f", timeout=300)
    wait_for(lambda: len(manifest(out)) >= 80, 30, "the manifest's last lines")
    lines = check_manifest(out, 80)
    assert {line["file"] for line in lines} == {
        f"hidden_states/hs_{i}.safetensors" for i in range(80)
    }
    counts = store.runs.counts()
    assert counts.failed == 0 and counts.written == 80
    assert took < 200, took
    # Whatever attempt the killed and the paused worker were at, no temporary file is left.
    assert stale_temporaries(out) == []
    shown = capture_stack.procs.run(["status", "--run", "f", "--json"], capture_stack.env)
    assert json.loads(shown.stdout)["stray_temporaries"] == 0


def test_capture_rides_out_a_redis_restart(procs: Procs, model_dir: Path, tmp_path: Path):
    require_tool("redis-server")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    durable = ("--appendonly", "yes", "--appendfsync", "always", "--save", "")
    server = start_redis(procs, port, data, *durable)
    stack = CaptureStack(procs, f"redis://127.0.0.1:{port}/0", model_dir, tmp_path)
    tokenized = write_tokenized(
        tmp_path / "tok", make_rows(40, seed=4, low=50, high=200), model_dir
    )
    out = tmp_path / "out"
    assert stack.enqueue(tokenized, "rr", out, "specforge").returncode == 0
    worker = stack.worker(concurrency=4)
    wait_for(lambda: len(manifest(out)) >= 3, 240, lambda: f"the first rows\n{procs.logs()}")
    procs.kill(server)
    start_redis(procs, port, data, *durable)
    stack.wait_complete("rr", timeout=300)
    assert worker.poll() is None
    wait_for(lambda: len(manifest(out)) >= 40, 30, "the manifest's last lines")
    check_manifest(out, 40)


def _mount_tmpfs(where: Path, size: str) -> str | None:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True, text=True,
    )  # fmt: skip
    return None if done.returncode == 0 else (done.stderr.strip() or "mount failed")


def test_a_full_disk_retries_rows_and_counts_no_partial_file(
    capture_stack: CaptureStack, model_dir: Path, tmp_path: Path
):
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small tmpfs")
    disk = tmp_path / "disk"
    why = _mount_tmpfs(disk, "200k")
    if why is not None:
        pytest.skip(f"cannot mount a small tmpfs here ({why})")
    try:
        tokenized = write_tokenized(
            tmp_path / "tok", make_rows(30, seed=5, low=40, high=80), model_dir
        )
        out = disk / "out"
        refused = capture_stack.enqueue(tokenized, "d", out, "speculators")
        assert refused.returncode == 1 and "--force" in refused.stderr
        capture_stack.env["EAGLEGEN_MAX_RETRIES"] = "200"
        assert capture_stack.enqueue(tokenized, "d", out, "speculators", "--force").returncode == 0
        capture_stack.worker(concurrency=4)
        store = capture_stack.store("d")

        def retried() -> bool:
            return int(store.r.hget(store.keys.counters, "retries") or 0) > 0

        wait_for(retried, 240, lambda: f"a retry on the full disk\n{capture_stack.procs.logs()}")
        for line in manifest(out):  # what is listed is whole, even with the disk full
            assert (out / line["file"]).stat().st_size == line["bytes"]
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        capture_stack.wait_complete("d", timeout=300)
        wait_for(lambda: len(manifest(out)) >= 30, 30, "the manifest's last lines")
        check_manifest(out, 30)
        assert not [p for p in (out / "hidden_states").iterdir() if p.name.endswith(".tmp")]
        assert "disk_full" in capture_stack.procs.logs(50000) or store.runs.counts().retries > 0
    finally:
        capture_stack.procs.stop_all()
        subprocess.run(["umount", "-l", str(disk)], check=False)
