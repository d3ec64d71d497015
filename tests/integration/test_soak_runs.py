"""`make soak` runs end to end (briefly): nothing imports bench/soak.py, so only running it
shows that it still fits the harness and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness import ROOT, child_env


def test_a_short_soak_completes_and_retires_its_run(redis_url: str) -> None:
    args = ["--samples", "200", "--workers", "1", "--concurrency", "4", "--redis-url", redis_url]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), *args],
        env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["samples"] == 200
    assert 0 < report["redis_bytes_retired_run"] < 1_000 < report["redis_bytes_run_before_retire"]
