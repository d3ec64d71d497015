"""The human form of ``eaglegen status``."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from common.models import Failure
from common.store import RunCounts


def render_status(console: Console, counts: RunCounts, failures: dict[str, Failure]) -> None:
    """Print progress, throughput and the failure reasons of a run."""
    table = Table(title=f"run {counts.run}", show_header=False)
    pct = 100.0 * (counts.done + counts.failed) / counts.total if counts.total else 0.0
    table.add_row("progress", f"{counts.done + counts.failed}/{counts.total} ({pct:.1f}%)")
    for name in ("total", "queued", "in_flight", "done", "failed", "written"):
        table.add_row(name, str(getattr(counts, name)))
    table.add_row("retries", str(counts.retries))
    table.add_row("completion tokens", str(counts.completion_tokens))
    if counts.started_at:
        elapsed = max(time.time() - counts.started_at, 1e-6)
        table.add_row("since start", f"{elapsed:.0f} s")
        table.add_row("samples/s", f"{counts.done / elapsed:.2f}")
        table.add_row("tokens/s", f"{counts.completion_tokens / elapsed:.1f}")
    table.add_row("complete", "yes" if counts.complete else "no")
    console.print(table)
    _render_failures(console, failures)


def _render_failures(console: Console, failures: dict[str, Failure]) -> None:
    if not failures:
        return
    by_kind: dict[str, list[Failure]] = {}
    for failure in failures.values():
        by_kind.setdefault(failure.kind, []).append(failure)
    for kind, items in sorted(by_kind.items()):
        console.print(f"failed ({kind}): {len(items)}, e.g. {items[-1].message}", highlight=False)
