"""The ``eaglegen`` command line: one sub-command per role."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from rich.console import Console

from cli import capture_cmd
from cli.gen_options import (
    GenerationConfigOpt,
    MaxTokensOpt,
    MinPOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    given_params,
)
from cli.shared import (
    RunOpt,
    console,
    die,
    fail,
    load_settings,
    open_store,
    out,
    stop_on_signals,
    wait_for_redis,
)
from common.errors import EagleGenError
from common.models import GenParams
from common.params import validated
from common.redact import redact_url
from common.stop import StopFlag

WHOLE_WIDTH = 100_000  # columns for output that is not a terminal: nothing is cut

app = typer.Typer(
    help="EagleGen: generate EAGLE-3 training data from vLLM servers over Celery + Redis.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command()
def enqueue(
    source: Annotated[str, typer.Argument(help="A .jsonl/.json/.parquet file or a HF dataset id.")],
    run: RunOpt = None,
    split: Annotated[str | None, typer.Option(help="Dataset split (hub datasets).")] = None,
    subset: Annotated[str | None, typer.Option(help="Dataset config name.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Read only the first N rows.")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="auto|openai|sharegpt|turns|prompt")
    ] = "auto",
    system: Annotated[str | None, typer.Option(help="System prompt for every sample.")] = None,
    turns: Annotated[
        str, typer.Option(help="all: regenerate every turn; first: only the first.")
    ] = "all",
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    generation_config: GenerationConfigOpt = None,
    thinking: Annotated[
        bool | None,
        typer.Option("--thinking/--no-thinking", help="Pass enable_thinking to the template."),
    ] = None,
    max_pending: Annotated[
        int | None, typer.Option(min=1, help="Most samples waiting at once (backpressure).")
    ] = None,
    max_pending_bytes: Annotated[
        int | None,
        typer.Option(help="About the most bytes of prompts waiting in Redis at once."),
    ] = None,
    history: Annotated[
        str,
        typer.Option(help="Tool calls: on-policy (while the calls match) or original."),
    ] = "on-policy",
) -> None:
    """Add a dataset's prompts to a run: each distinct prompt once, ever."""
    from cli.enqueue_cmd import run_enqueue

    if fmt not in ("auto", "openai", "sharegpt", "turns", "prompt"):
        fail(f"--format must be auto, openai, sharegpt, turns or prompt, not {fmt!r}", 2)
    if turns not in ("all", "first"):
        fail(f"--turns must be all or first, not {turns!r}", 2)
    if history not in ("on-policy", "original"):
        fail(f"--history must be on-policy or original, not {history!r}", 2)
    settings = load_settings(run=run, max_pending=max_pending, max_pending_bytes=max_pending_bytes)
    kwargs = {"enable_thinking": thinking} if thinking is not None else None
    given = given_params(
        generation_config, max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        min_p=min_p,
    )  # fmt: skip
    fields = {"turns": turns, "system": system, "chat_template_kwargs": kwargs, **given,
              "history": "original" if history == "original" else None}  # fmt: skip
    params = validated(GenParams, fields)
    run_enqueue(settings, open_store(settings), source, params, fmt, split, subset, limit)


@app.command()
def worker(
    concurrency: Annotated[int | None, typer.Option(min=1, help="Requests in flight.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Start a Celery worker that answers queued samples (threads pool)."""
    import os

    from common.logs import setup_logging
    from worker.app import create_app

    settings = load_settings(concurrency=concurrency)
    setup_logging(settings, loglevel.upper())
    if "endpoints" not in settings.model_fields_set:  # nothing configured: say where it goes
        console.print(f"EAGLEGEN_ENDPOINTS is not set: using the default {settings.endpoints[0]}")
    wait_for_redis(settings)  # a worker started while Redis restarts comes up with it
    celery = create_app(settings)
    celery.worker_main(
        [
            "worker", f"--concurrency={settings.concurrency}", "--pool=threads",
            f"--loglevel={loglevel}", f"--queues={settings.queue}",
            f"--hostname=eaglegen-{os.getpid()}@%h", "--without-mingle", "--without-gossip",
        ]
    )  # fmt: skip


@app.command()
def collect(
    out_path: Annotated[Path, typer.Option("--out", help="JSONL file to append to.")],
    run: RunOpt = None,
    once: Annotated[bool, typer.Option(help="Drain what is ready, then exit.")] = False,
) -> None:
    """Move finished samples from Redis to a JSONL file (exactly one line per sample)."""
    from collector.collect import Collector
    from collector.files import created_files
    from collector.sink import JsonlSink
    from common.logs import setup_logging

    settings = load_settings(run=run)
    setup_logging(settings)
    store = open_store(settings)
    with created_files(out_path):  # a collector that gives up leaves no empty file behind
        sink = JsonlSink(out_path, settings.run)
        stop = stop_on_signals()
        collector = Collector(store, sink, settings.collect_batch, settings.collector_lock_ttl)
        try:
            if once:
                stats = _collect_with_progress(collector, stop, store.ready_count())
            else:
                stats = collector.run(stop)
        finally:
            sink.close()
    out.print(
        f"collected {stats.written} records into {out_path} "
        f"(already in the file: {stats.skipped_present})", highlight=False,
    )  # fmt: skip


def _collect_with_progress(collector: Any, stop: StopFlag, total: int) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("collect", total=total)

        def on_batch(stats: Any) -> None:
            progress.update(task, completed=stats.written + stats.skipped_present)

        return collector.run(stop, once=True, on_batch=on_batch)


@app.command()
def status(
    run: RunOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="A live view, redrawn.")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between redraws.")] = 2.0,
) -> None:
    """Show a run's progress, throughput, ETA, errors and endpoints."""
    from cli import status_view

    settings = load_settings(run=run)
    if capture_cmd.is_capture_run(settings):
        return capture_cmd.show_status(settings, as_json)
    store = open_store(settings)
    if not store.exists() and not watch:
        if (summary := store.retired_summary()) is not None:
            fail(f"run {settings.run!r} is retired: {json.dumps(summary)}")
        fail(f"no run named {settings.run!r} in {redact_url(settings.redis_url)}")
    # Piped or redirected: whole lines (no URL or message cut to a terminal's width).
    view = out if out.is_terminal else Console(width=WHOLE_WIDTH, soft_wrap=True)
    if watch:
        status_view.watch(view, store, settings, interval)
    elif as_json:
        print(json.dumps(status_view.gather(store, settings), indent=2))
    else:
        view.print(status_view.render(status_view.gather(store, settings), out.is_terminal))


@app.command()
def reconcile(run: RunOpt = None) -> None:
    """Find samples that fell through (lost messages, dead workers) and re-enqueue them."""
    from broker.app import create_broker_app
    from worker.pipeline.reconcile import Reconciler

    settings = load_settings(run=run)
    store = open_store(settings)
    reconciler = Reconciler(store.r, settings, create_broker_app(settings).publish_samples)
    runs = [settings.run] if run else None
    reconciler.run_once(runs)  # a sample counts as lost only if two passes agree
    time.sleep(1.0)
    for report in reconciler.run_once(runs):
        out.print(report.line(), highlight=False)


@app.command()
def exporter(
    port: Annotated[int, typer.Option(help="Port for /metrics.")] = 9810,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
) -> None:
    """Serve every run's state (queued, in flight, done, failed, tokens) for Prometheus."""
    from prometheus_client import CollectorRegistry

    from common.metrics import RunCollector, serve
    from worker.endpoints.server_cache import PrefixCacheCollector

    settings = load_settings()
    store = open_store(settings)
    registry = CollectorRegistry()
    registry.register(RunCollector(store.r, settings))
    registry.register(PrefixCacheCollector(settings.endpoints))
    serve(registry, port, host)
    console.print(f"exporter: http://{host}:{port}/metrics")
    stop_on_signals().wait()


@app.command()
def demo(
    keep: Annotated[
        bool, typer.Option(help="Leave the run's keys in EAGLEGEN_REDIS_URL's Redis.")
    ] = False,
) -> None:
    """Run the bundled prompts through a local simulator, worker and collector (and a Redis of
    its own unless EAGLEGEN_REDIS_URL is set)."""
    from cli.demo import run_demo

    run_demo(load_settings(), keep=keep)


def _register_plugins() -> None:
    # Other roles register their own commands; a missing extra only disables those.
    from cli import capture_cmd, endpoints_cmd, failed_cmd, runs_cmd
    from simulator import cli as simulator_cli
    from training import cli as training_cli

    for module in (simulator_cli, training_cli, endpoints_cmd, runs_cmd, failed_cmd, capture_cmd):
        module.register(app)


def main() -> None:
    """Console-script entry point: expected failures become one line, not a traceback."""
    _register_plugins()
    try:
        app()
    except EagleGenError as exc:
        die(str(exc))
    except redis.ConnectionError as exc:
        die(f"lost the Redis connection: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
