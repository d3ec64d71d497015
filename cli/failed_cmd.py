"""``eaglegen failed`` (which samples failed, and why) and ``eaglegen retry-failed`` (run them
again, under new generation parameters if given: a sample whose parameters change starts again
from its first turn, so that its record's parameters are those of every turn)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cli.gen_options import (
    GenerationConfigOpt,
    MaxTokensOpt,
    MinPOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    given_params,
)
from cli.shared import RunOpt, console, fail, load_settings, open_store, out
from common.models import GenParams, Sample
from common.params import validated
from common.store import RunStore

KindOpt = Annotated[str | None, typer.Option("--kind", help="Only failures of this kind.")]


def failed(
    run: RunOpt = None,
    kind: KindOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list.")] = False,
) -> None:
    """List a run's failed samples: id, kind, message, attempts, source row."""
    settings = load_settings(run=run)
    store = open_store(settings)
    if not store.exists():
        fail(f"no run named {settings.run!r}")
    rows = failed_rows(store, kind)
    if as_json:
        print(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    for row in rows:
        out.print(
            f"{row['id']}  {row['kind']}  attempts {row['attempts']}  {row['source']}  "
            f"{row['message']}{_own_params(row['params'])}", highlight=False, soft_wrap=True,
            markup=False,
        )  # fmt: skip
    console.print(
        f"{len(rows)} failed samples in run {store.run!r} (retry-failed with new parameters "
        "starts each again from its first turn)",
        highlight=False,
    )


def _own_params(params: dict[str, Any] | None) -> str:
    if not params:
        return ""
    shown = ", ".join(f"{k} {v}" for k, v in params.items())
    return f"  [retried from its first turn under {shown}]"


def failed_rows(store: RunStore, kind: str | None = None) -> list[dict[str, Any]]:
    """The failed samples, oldest failure first, as JSON-ready rows."""
    failures = sorted(store.failures().items(), key=lambda item: item[1].at)
    failures = [(i, f) for i, f in failures if kind is None or f.kind == kind]
    samples = store.failed_samples([i for i, _ in failures])
    return [
        {"id": i, "kind": f.kind, "message": f.message, "attempts": f.attempts, "at": f.at,
         "source": _source(s), "params": s.params.model_dump(exclude_none=True)
         if s is not None and s.params is not None else None}
        for (i, f), s in zip(failures, samples, strict=True)
    ]  # fmt: skip


def _source(sample: Sample | None) -> str:
    if sample is None:
        return "-"
    ref = sample.source
    unit = "line" if ref.dataset.lower().endswith(".jsonl") else "row"
    return f"{ref.dataset} {unit} {ref.row + 1}"


def retry_failed(
    run: RunOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    generation_config: GenerationConfigOpt = None,
) -> None:
    """Put a run's failed samples back in the queue, under new generation parameters if given
    (each retried sample keeps them and starts again from its first turn; its record says so)."""
    from broker.app import create_broker_app
    from broker.publish import publish
    from cli.enqueue_cmd import max_prompt_tokens
    from worker.pipeline.breaker import reset

    settings = load_settings(run=run)
    store = open_store(settings)
    changes = given_params(
        generation_config, max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        min_p=min_p,
    )  # fmt: skip
    if changes:
        base = store.params() or GenParams()
        probe = validated(GenParams, {**base.model_dump(), **changes})
        # Refuses a max_tokens no server takes, with one that leaves the prompts room.
        max_prompt_tokens(settings, probe, console, lambda: _estimates(store, probe))
        restarted, dropped = _set_params(store, base, changes)
    reset(store)  # the breaker: the cause was fixed, or the user says so
    ids = store.requeue_failed()
    sent = publish(create_broker_app(settings), settings.queue, settings.run, ids)
    shown = f" with {', '.join(f'{k} {v}' for k, v in changes.items())}" if changes else ""
    if changes:
        shown += (
            f"; {restarted} start again from their first turn under them ({dropped} turns "
            "answered under the old parameters dropped: a record holds one set of parameters)"
        )
    out.print(
        f"requeued {sent} failed samples of run {settings.run!r}{shown}", highlight=False,
        soft_wrap=True,
    )  # fmt: skip


def _estimates(store: RunStore, params: GenParams) -> list[int]:
    """Lower bounds of the failed samples' first prompts' tokens."""
    from producer.preflight import prompt_estimate

    samples = store.failed_samples(list(store.failures()))
    return [
        prompt_estimate(params.system_for(s.system), params.turns_of(s.user_turns))
        for s in samples if s is not None
    ]  # fmt: skip


def _set_params(store: RunStore, base: GenParams, changes: dict[str, Any]) -> tuple[int, int]:
    """Give each failed sample the new parameters; those whose parameters change start again
    from their first turn. Returns how many do, and the answered turns they drop."""
    ids = list(store.failures())
    updated = []
    for sample in store.failed_samples(ids):
        if sample is not None:
            own = sample.params or base
            params = validated(GenParams, {**own.model_dump(), **changes})
            if params != own:
                updated.append(sample.model_copy(update={"params": params}))
    return len(updated), store.replace_failed_samples(updated)


def register(app: typer.Typer) -> None:
    """Add the commands to ``eaglegen``."""
    app.command("failed")(failed)
    app.command("retry-failed")(retry_failed)
