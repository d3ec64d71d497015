"""The benchmark scripts still start: nothing imports them, so a rename elsewhere breaks them
silently until someone runs `make bench` (it happened twice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
# Scripts, not the modules they share (stack.py, capture_scale.py).
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "__main__" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
