"""Small helpers shared by the training tests."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Write rows (dicts, or raw strings written as-is) one per line."""
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def quiet() -> dict[str, Any]:
    """Return tokenize() keyword arguments for no progress bar and captured output."""
    return {"progress": False, "console": Console(file=io.StringIO(), width=200)}


def masked_runs(mask: list[int]) -> list[tuple[int, int]]:
    """Return the [start, end) ranges of consecutive 1s in a loss mask."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs
