"""What every ``eaglegen`` sub-command shares: consoles, settings, one-line errors, Redis."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Annotated, Any, NoReturn

import redis
import typer
from rich.console import Console

from common.redact import redact_url
from common.settings import Settings
from common.stop import StopFlag
from common.store import RunStore, connect
from common.unknown_settings import unknown_settings

console = Console(stderr=True, soft_wrap=True)
out = Console()

RunOpt = Annotated[str | None, typer.Option("--run", help="Run name [env EAGLEGEN_RUN].")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a one-line error and exit."""
    console.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


def die(message: str) -> NoReturn:
    """Print a one-line error and exit 1 (outside typer's handling)."""
    console.print(f"[red]error:[/red] {message}", highlight=False)
    sys.exit(1)


def load_settings(**overrides: Any) -> Settings:
    """The process's settings: environment and .env, then command-line overrides."""
    if (warning := unknown_settings(os.environ)) is not None:
        console.print(warning, highlight=False, markup=False)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        fail(f"bad settings: {_first_error(exc)}", 2)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()))
        return f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
    return str(exc)


def open_store(settings: Settings) -> RunStore:
    """The run's store, after checking Redis answers (clear error if it does not)."""
    client = connect(settings.redis_url, settings.redis_sentinel_master)
    try:
        client.ping()
    except redis.RedisError as exc:
        fail(f"cannot reach Redis at {redact_url(settings.redis_url)} ({exc})")
    return RunStore(client, settings.key_prefix, settings.run)


def wait_for_redis(settings: Settings, every_s: float = 2.0) -> None:
    """Block until Redis answers, saying once (clearly) that we wait: a long-lived role (a
    worker) started while Redis restarts must come up with it, not exit."""
    client = connect(settings.redis_url, settings.redis_sentinel_master)
    said = False
    while True:
        try:
            client.ping()
            break
        except redis.RedisError as exc:
            if not said:
                where = redact_url(settings.redis_url)
                console.print(
                    f"cannot reach Redis at {where} ({exc}); waiting for it", highlight=False
                )
                said = True
            time.sleep(every_s)
    client.close()


def stop_on_signals() -> StopFlag:
    """A flag set by SIGTERM or SIGINT, for loops that finish their step and exit.

    Not a ``threading.Event``: its ``set`` takes a lock the waiting main thread may hold.
    """
    stop = StopFlag()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
