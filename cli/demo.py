"""``eaglegen demo``: the whole pipeline on this machine, against the bundled simulator.

Starts a simulator, a worker and a collector as child processes, enqueues the bundled
MT-Bench and Vicuna-bench prompts, waits for the run to complete, checks the JSONL, prints a
summary and stops what it started. Its Redis is a redis-server of its own on a free port
(nothing kept on disk), unless EAGLEGEN_REDIS_URL is set: then that one, said at the start
(one run, ``demo-<time>``, deleted at the end unless ``--keep``). SIGTERM stops it as Ctrl-C
does: its children are stopped too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.enqueue_cmd import run_enqueue
from common.errors import EagleGenError
from common.keys import CUT_TURNS, DROPPED_TURNS
from common.models import GenParams
from common.redact import redact_url
from common.settings import Settings
from common.store import RunStore, connect

DATA = Path(__file__).resolve().parent.parent / "data"
SOURCES = ("mt_bench_question.jsonl", "vicuna_bench_question.jsonl")
TIMEOUT_S = 600.0


def run_demo(base: Settings, keep: bool = False) -> None:
    """Run the demo end to end and print its figures."""
    # Like Ctrl-C (an exception, no lock taken): the children are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    console = Console(stderr=True)
    if "redis_url" in base.model_fields_set:
        return _run(base, keep, console, named=True)
    with _own_redis(Path("out") / "logs") as url:
        console.print(f"Redis: a server of the demo's own at {url}, stopped at the end "
                      "(set EAGLEGEN_REDIS_URL to use yours)", highlight=False)  # fmt: skip
        _run(base.model_copy(update={"redis_url": url}), keep, console, named=False)


def _run(base: Settings, keep: bool, console: Console, named: bool) -> None:
    run = time.strftime("demo-%Y%m%d-%H%M%S")
    port = _free_port()
    settings = base.model_copy(
        update={
            "run": run,
            "queue": f"eaglegen-{run}",
            "endpoints": [f"http://127.0.0.1:{port}/v1"],
        }
    )
    if named:
        _announce(settings, keep, console)
    out = Path("out") / f"{run}.jsonl"
    client = connect(settings.redis_url, settings.redis_sentinel_master)
    store = RunStore(client, settings.key_prefix, run)
    store.r.ping()
    started = time.monotonic()
    with _children(settings, port, out, console):
        for name in SOURCES:
            run_enqueue(settings, store, str(DATA / name), GenParams(max_tokens=512), "auto",
                        None, None, None)  # fmt: skip
        _wait_complete(store, console)
    elapsed = time.monotonic() - started
    _summary(store, out, elapsed, console)
    if not keep:
        store.delete()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _announce(settings: Settings, keep: bool, console: Console) -> None:
    """Say what the demo writes to a Redis it did not start."""
    fate = "kept: --keep" if keep else "deleted at the end"
    where = redact_url(settings.redis_url)
    console.print(
        f"Redis: {where} (EAGLEGEN_REDIS_URL): the demo writes run {settings.run} there (its "
        f"keys {fate}); the bindings of queue {settings.queue} and the simulator endpoint's "
        "health stay", highlight=False,
    )  # fmt: skip


@contextmanager
def _own_redis(logs: Path) -> Iterator[str]:
    """A redis-server on a free loopback port, nothing on disk; its URL. Stopped on leaving."""
    program = shutil.which("redis-server")
    if program is None:
        raise EagleGenError(
            "the demo starts a Redis of its own and needs redis-server (make demo installs it "
            "where it can; apt-get install redis-server), or EAGLEGEN_REDIS_URL set to a Redis "
            "it may write a run to"
        )
    logs.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    where = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(logs.resolve())]
    command = [program, *where, "--save", "", "--appendonly", "no", "--logfile", "redis.log"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        _wait_redis(url, proc)
        yield url
    finally:
        _stop({"redis": proc})


def _wait_redis(url: str, proc: subprocess.Popen[bytes]) -> None:
    client = connect(url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EagleGenError("the demo's redis-server exited at start-up (see out/logs)")
        try:
            client.ping()
            return
        except redis.RedisError:
            time.sleep(0.1)
    raise EagleGenError("the demo's redis-server did not answer within 30 s")


def _env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        EAGLEGEN_REDIS_URL=settings.redis_url, EAGLEGEN_RUN=settings.run,
        EAGLEGEN_QUEUE=settings.queue, EAGLEGEN_ENDPOINTS=",".join(settings.endpoints),
    )  # fmt: skip
    return env


@contextmanager
def _children(settings: Settings, port: int, out: Path, console: Console) -> Iterator[None]:
    cli = [sys.executable, "-m", "cli.main"]
    logs = Path("out") / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    commands = {
        "simulator": [*cli, "simulate", "--port", str(port), "--time-per-token", "0.002",
                      "--max-num-seqs", "32", "--max-answer-tokens", "256"],
        "worker": [*cli, "worker", "--concurrency", "32", "--loglevel", "WARNING"],
        "collector": [*cli, "collect", "--out", str(out)],
    }  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, command in commands.items():
            log = (logs / f"{settings.run}-{name}.log").open("wb")
            procs[name] = subprocess.Popen(command, env=_env(settings), stdout=log, stderr=log)
        _wait_http(port, procs["simulator"])
        console.print(f"started simulator :{port}, worker, collector -> {out} (logs in {logs})")
        yield
    finally:
        _stop(procs)


def _wait_http(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EagleGenError("the simulator exited at start-up (see out/logs)")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise EagleGenError("the simulator did not start within 30 s")


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    # SIGTERM: the collector flushes and exits, the worker hands back what it holds.
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_complete(store: RunStore, console: Console) -> None:
    columns = (TextColumn("generating"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("run", total=store.counts().total, detail="")
        while time.monotonic() < deadline:
            counts = store.counts()
            detail = f"failed {counts.failed}, written {counts.written}"
            progress.update(task, completed=counts.done + counts.failed, detail=detail)
            if counts.complete:
                return
            time.sleep(0.25)
    raise EagleGenError(f"the demo run did not complete within {TIMEOUT_S:.0f} s")


def _summary(store: RunStore, out: Path, elapsed: float, console: Console) -> None:
    counts = store.counts()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    unique = len(set(ids))
    cut, dropped = store.r.hmget(store.keys.counters, [CUT_TURNS, DROPPED_TURNS])
    print(
        f"demo run {store.run}: {counts.total} samples, {counts.done} answered, "
        f"{counts.failed} failed, {len(ids)} lines ({unique} distinct ids), "
        f"{elapsed:.1f} s wall, {counts.done / elapsed:.1f} samples/s, "
        f"{counts.completion_tokens} completion tokens, {int(cut or 0)} turns cut at max_tokens "
        f"({int(dropped or 0)} later turns dropped)"
    )
    print(f"output: {out}")
    if unique != len(ids) or len(ids) != counts.done:
        raise EagleGenError("the JSONL does not hold exactly one line per answered sample")
