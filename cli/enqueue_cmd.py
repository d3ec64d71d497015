"""``eaglegen enqueue``: wires the producer to Redis, the broker and a progress display."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from broker.app import create_broker_app
from broker.publish import publish
from common.models import GenParams
from common.settings import Settings
from common.store import RunStore
from producer.enqueue import EnqueueCounts, Feeder, prompt_estimates
from producer.preflight import check_max_tokens, server_limits
from producer.readers import SourceInfo, open_source

MAX_INVALID_SHOWN = 20


def run_enqueue(
    settings: Settings,
    store: RunStore,
    source: str,
    params: GenParams,
    fmt: str,
    split: str | None,
    subset: str | None,
    limit: int | None,
) -> EnqueueCounts:
    """Feed ``source`` into the run and print the one-line summary (stdout; the rest stderr)."""
    console = Console(stderr=True)
    store.check_params(params, settings.queue)  # the run is created with its first sample

    def estimates() -> list[int]:
        return prompt_estimates(open_source(source, split, subset)[1], fmt, params)

    room = max_prompt_tokens(settings, params, console, estimates)
    info, rows = open_source(source, split, subset)
    broker = create_broker_app(settings)
    shown = [0]

    def on_invalid(row: int, reason: str) -> None:
        shown[0] += 1
        if shown[0] <= MAX_INVALID_SHOWN:
            console.print(f"{where(info, row)}: skipped, {reason}", highlight=False)
        elif shown[0] == MAX_INVALID_SHOWN + 1:
            console.print("(further invalid rows are counted, not shown)")

    with _progress(console) as progress:
        total = min(x for x in (limit, info.rows) if x is not None) if limit or info.rows else None
        task = progress.add_task(f"enqueue {info.dataset} -> run {store.run}", total=total, info="")

        def on_progress(counts: EnqueueCounts) -> None:
            progress.update(task, completed=counts.rows, info=f"enqueued {counts.enqueued}")

        feeder = Feeder(
            store=store, params=params, info=info,
            publish=lambda ids: publish(broker, settings.queue, store.run, ids), fmt=fmt,
            max_pending=settings.max_pending, max_pending_bytes=settings.max_pending_bytes,
            max_row_bytes=settings.max_row_bytes, on_invalid=on_invalid, on_progress=on_progress,
            max_prompt_tokens=room, claim=lambda: store.ensure_params(params, settings.queue),
        )  # fmt: skip
        counts = feeder.run(rows, limit)
    print(counts.line())
    return counts


def max_prompt_tokens(
    settings: Settings, params: GenParams, console: Console,
    prompts: Callable[[], Sequence[int]] = tuple,
) -> int | None:  # fmt: skip
    """What ``max_tokens`` leaves of the servers' ``max_model_len`` for a first prompt; refuses
    (InvalidParams) a ``max_tokens`` that leaves nothing, with one that leaves room for most
    of ``prompts`` (estimates, asked for only then). None: no server said."""
    limits = server_limits(settings.endpoints, settings.model, settings.api_key_value())
    if limits.unchecked:
        # Enqueued all the same: servers may still be starting (docs/sampling-and-status.md).
        none = (
            " (no endpoint gave its max_model_len: enqueued unchecked)"
            if len(limits.unchecked) == len(settings.endpoints)
            else ""
        )
        console.print(
            "warning: max_tokens and prompt lengths not checked against "
            f"{'; '.join(limits.unchecked)}{none}; the workers' errors still apply",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    check_max_tokens(params, limits, prompts)
    if limits.max_model_len is None:
        return None
    return limits.max_model_len - params.max_tokens


def where(info: SourceInfo, index: int) -> str:
    """A row named as a user finds it: the 1-based line of a JSONL file, else the 1-based row."""
    unit = "line" if info.dataset.lower().endswith(".jsonl") else "row"
    return f"{unit} {index + 1}"


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
        TextColumn("{task.completed} rows"), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=console, transient=True,
    )  # fmt: skip
