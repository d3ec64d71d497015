"""Redis servers of the tests' own (password, ACL user, TLS, Sentinel) on free loopback ports.

Each runs in the test's tmp dir with nothing kept on disk and is stopped at teardown. A tool
that is missing skips the test locally and fails it in CI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, Procs, free_port, wait_for
from tests.integration.conftest import pytest_runtest_makereport as pytest_runtest_makereport

__all__ = ["ROOT", "RedisServers", "assert_not_in_logs", "free_port", "require_tool", "wait_for"]


def require_tool(name: str) -> str:
    """The tool's path; skip without it, but fail in CI where every tool must be installed."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is needed in CI (see .ci/run)")
        pytest.skip(f"{name} is not installed")
    return path


def assert_not_in_logs(tmp: Path, secret: str) -> None:
    """No log file of the test's processes holds ``secret``."""
    leaked = [p.name for p in tmp.glob("*.log") if secret in p.read_text()]
    assert not leaked, f"the Redis password is in {leaked}"


class RedisServers:
    """redis-server processes of one test (plain, TLS or sentinel), all stopped at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, tls: bool = False, ready: str = "Ready to accept") -> int:
        """Start a server with ``args`` on a free loopback port; returns the port."""
        require_tool("redis-server")
        port = free_port()
        name = f"redis-{len(self.procs)}"
        listen = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
        log = self.tmp / f"{name}.log"
        base = ["--bind", "127.0.0.1", "--dir", str(self.tmp), "--logfile", str(log)]
        off_disk = ["--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(["redis-server", *args, *listen, *base, *off_disk])
        self.procs.append(proc)
        self._wait_ready(proc, log, ready)
        return port

    def sentinel(self, master_port: int, master: str, password: str | None = None) -> int:
        """Start a sentinel monitoring ``master`` at ``master_port``; returns its port."""
        conf = self.tmp / f"sentinel-{len(self.procs)}.conf"
        lines = [
            f"sentinel monitor {master} 127.0.0.1 {master_port} 1",
            f"sentinel down-after-milliseconds {master} 1000",
            f"sentinel failover-timeout {master} 4000",
        ]
        if password:
            lines.append(f"sentinel auth-pass {master} {password}")
        conf.write_text("\n".join(lines) + "\n")
        # Sentinel rewrites its config file, so it must be a file of its own.
        return self.start(str(conf), "--sentinel", ready="+monitor master")

    def _wait_ready(self, proc: subprocess.Popen[bytes], log: Path, ready: str) -> None:
        def up() -> bool:
            if proc.poll() is not None:
                text = log.read_text() if log.exists() else ""
                pytest.fail(f"redis-server exited with {proc.returncode}:\n{text[-2000:]}")
            return log.exists() and ready in log.read_text()

        wait_for(up, 15, f"redis-server to log {ready!r}", every=0.05)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RedisServers]:
    started = RedisServers(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(p.logs())
