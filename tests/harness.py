"""Child processes of the tests, `make bench` and `make chaos`: one way to start and stop them.

Every child starts from a known environment (`child_env`): a few basics of the host and none
of the developer's ``EAGLEGEN_*`` settings; the caller adds what the child should see. Each
child logs to a file of its own; `Procs.stop_all` SIGTERMs every child, then SIGKILLs what
outlives the grace period. Nothing here imports pytest: bench/ and scripts/ use it too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]
# Every EagleGen role is started by its command line, as a user starts it.
CLI = (sys.executable, "-m", "cli.main")
# ... from this checkout's code, whichever venv runs it: a venv's editable install points at the
# checkout it was made in, so a second worktree (or an old commit benchmarked side by side)
# would otherwise run that one's code in its children.
CLI_ENV = {"PYTHONPATH": str(ROOT)}
# What a child keeps of the host's environment: enough to find programs and speak the locale.
HOST_VARIABLES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
HOST_PREFIXES = ("LC_",)

Child = subprocess.Popen[bytes]


class ChildExited(RuntimeError):
    """A child process ended while it was expected to serve."""


def child_env(*layers: Mapping[str, str]) -> dict[str, str]:
    """The host's basics (no ``EAGLEGEN_*``, no ``CI``), unbuffered output, then ``layers``."""
    env = {
        k: v for k, v in os.environ.items() if k in HOST_VARIABLES or k.startswith(HOST_PREFIXES)
    }
    env["PYTHONUNBUFFERED"] = "1"  # a killed child's log still shows its last lines
    for layer in layers:
        env.update(layer)
    return env


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    what: str | Callable[[], str],
    every: float = 0.1,
) -> None:
    """Poll until ``predicate`` holds; raise `TimeoutError` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    if not predicate():  # the last poll may have slept past a success
        text = what() if callable(what) else what
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {text}")


class Procs:
    """Child processes logging to ``logs/<name>-<n>.log``, stopped together at the end.

    ``env`` is added to every child's environment; ``nice`` lowers the priority of every
    EagleGen command (a benchmark's clients must not slow its simulated server down);
    ``own_group`` puts each child in a process group of its own, so that a kill also takes
    whatever the child started.
    """

    def __init__(
        self,
        logs: Path,
        env: Mapping[str, str] | None = None,
        *,
        grace: float = 20.0,
        nice: int = 0,
        own_group: bool = False,
    ) -> None:
        self.logs_dir = logs
        self.env = dict(env or {})
        self.grace = grace
        self.nice = nice
        self.own_group = own_group
        self.procs: list[Child] = []

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        nice: int | None = None,
    ) -> Child:
        """Start ``eaglegen ARGS`` (``python -m cli.main``); ``nice`` overrides the default."""
        nice = self.nice if nice is None else nice
        prefix = ["nice", "-n", str(nice)] if nice else []
        return self.start_program(name, [*prefix, *CLI, *args], {**CLI_ENV, **(env or {})})

    def start_program(
        self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Child:
        """Start any program, from the known environment plus ``env``."""
        log = self.logs_dir / f"{name}-{len(self.procs)}.log"
        with log.open("wb") as out:  # the child holds its own copy of the descriptor
            proc = subprocess.Popen(
                list(command),
                cwd=self.logs_dir,  # not the checkout: no developer's .env is read
                env=child_env(self.env, env or {}),
                stdout=out,
                stderr=out,
                start_new_session=self.own_group,
            )
        self.procs.append(proc)
        return proc

    def run(
        self, args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``eaglegen ARGS`` to its end; its output captured as text."""
        return subprocess.run(
            [*CLI, *args],
            cwd=self.logs_dir,
            env=child_env(CLI_ENV, self.env, env or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def kill(self, proc: Child) -> None:
        """SIGKILL a child (and its group) now and reap it."""
        self._signal(proc, signal.SIGKILL, group=self.own_group)
        proc.wait()

    def stop(self, *procs: Child, grace: float | None = None) -> None:
        """SIGTERM ``procs``; SIGKILL any that outlive the grace period (shared by all)."""
        for proc in procs:
            if proc.poll() is None:
                self._signal(proc, signal.SIGTERM, group=False)
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        for proc in procs:
            if not self._ended(proc, deadline):
                self._signal(proc, signal.SIGKILL, group=self.own_group)
            proc.wait()

    def stop_all(self, grace: float | None = None) -> None:
        """Stop every child started so far."""
        self.stop(*self.procs, grace=grace)

    def kill_all(self) -> None:
        """SIGKILL every child still running (an emergency stop)."""
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)

    def logs(self, chars: int = 3000) -> str:
        """The last ``chars`` of every log file in the log folder."""
        files = sorted(self.logs_dir.glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in files)

    def _ended(self, proc: Child, deadline: float) -> bool:
        """Whether ``proc`` (and, with ``own_group``, all of its group) ended by ``deadline``."""
        while True:
            proc.poll()  # reap: a zombie leader still counts as a member of its group
            if proc.returncode is not None and not (self.own_group and _group_alive(proc)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    @staticmethod
    def _signal(proc: Child, sig: signal.Signals, group: bool) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)  # the group's id is its leader's pid
            else:
                proc.send_signal(sig)


def _group_alive(proc: Child) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Simulator:
    """One simulator process and its control endpoints."""

    url: str
    proc: Child

    @property
    def endpoint(self) -> str:
        """The OpenAI base URL."""
        return f"{self.url}/v1"

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200; `ChildExited` if the process is gone."""
        if self.proc.poll() is not None:
            raise ChildExited(f"the simulator exited with {self.proc.returncode}")
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stats(self) -> dict[str, Any]:
        """GET /sim/stats."""
        body: dict[str, Any] = httpx.get(f"{self.url}/sim/stats", timeout=10).json()
        return body

    def configure(self, **change: Any) -> None:
        """POST /sim/config (capacity or pacing, mid-run)."""
        httpx.post(f"{self.url}/sim/config", json=change, timeout=10).raise_for_status()


def start_simulator(
    procs: Procs, *options: str, port: int | None = None, timeout: float = 30
) -> Simulator:
    """``eaglegen simulate`` at normal priority on a free port; returns once it answers."""
    port = port or free_port()
    proc = procs.start("simulator", ["simulate", "--port", str(port), *options], nice=0)
    sim = Simulator(f"http://127.0.0.1:{port}", proc)
    try:
        wait_for(sim.healthy, timeout, "the simulator to answer /health")
    except ChildExited as exc:
        raise ChildExited(f"{exc}:\n{procs.logs()}") from None
    return sim


def start_redis(
    procs: Procs,
    port: int,
    workdir: Path,
    *options: str,
    tls: bool = False,
    ready: str = "Ready to accept",
    timeout: float = 15,
) -> Child:
    """``redis-server OPTIONS`` on 127.0.0.1:``port``, files in ``workdir``; waits for ``ready``.

    Readiness is read from the server's log (a TLS-only or sentinel server answers no plain
    PING); only what the log gained since this start counts, so a restart waits afresh.
    """
    log = workdir / f"redis-{port}.log"
    seen = log.stat().st_size if log.exists() else 0
    listen = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
    where = ["--bind", "127.0.0.1", "--dir", str(workdir), "--logfile", str(log)]
    proc = procs.start_program("redis-server", ["redis-server", *options, *listen, *where])

    def up() -> bool:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ChildExited(f"redis-server exited with {proc.returncode}:\n{tail}")
        return log.exists() and ready.encode() in log.read_bytes()[seen:]

    wait_for(up, timeout, f"redis-server to log {ready!r}", every=0.05)
    return proc


OFF_DISK = ("--save", "", "--appendonly", "no")


@contextlib.contextmanager
def own_redis(workdir: Path) -> Iterator[str]:
    """A redis-server of the caller's own on a free loopback port (nothing kept on disk), stopped
    on leaving; its URL. Tests, benchmarks and the demo write no Redis they did not start."""
    with Procs(workdir, grace=10) as procs:
        port = free_port()
        start_redis(procs, port, workdir, *OFF_DISK)
        yield f"redis://127.0.0.1:{port}/0"


def redis_url_or_own(url: str | None) -> str:
    """``url``, or that of a Redis of this process's own (a script's), stopped at its exit."""
    if url:
        return url
    workdir = Path(tempfile.mkdtemp(prefix="eaglegen-redis-"))
    own = own_redis(workdir)
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    atexit.register(own.__exit__, None, None, None)
    return own.__enter__()


def delete_keys(client: redis.Redis, prefix: str, queue: str) -> None:
    """Delete one scenario's keys (its prefix, its queue's lists and bindings) and no other."""
    for pattern in (f"{prefix}:*", f"{queue}*", f"_kombu.binding.{queue}*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
