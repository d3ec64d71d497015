"""A real vLLM CPU server (``scripts/setup_vllm.sh``) serving the tiny Qwen3 built at set-up.

The server runs in its own venv and process group on loopback and is stopped by its pid at
teardown. Where it was never installed the tier skips with the set-up's reason; in CI
(``CI`` set) that is a failure, as is a server that is installed but does not come up.
Redis is DB 11 unless ``EAGLEGEN_TEST_REDIS_URL`` says otherwise: other tiers use other DBs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.conftest import (  # noqa: F401  (fixtures, re-exported for this tier)
    ROOT,
    Procs,
    Stack,
    free_port,
    procs,
    pytest_runtest_makereport,
    rdb,
    wait_for,
)

VENV = ROOT / os.environ.get("EAGLEGEN_VLLM_VENV", ".vllm-venv")
MODEL_DIR = ROOT / os.environ.get("EAGLEGEN_VLLM_MODEL", ".eaglegen/tiny-qwen3")
SETUP_FAILED = ROOT / ".eaglegen" / "vllm-setup.failed"
MODEL_NAME = "tiny-qwen3"
MAX_MODEL_LEN = 2048
START_TIMEOUT = 300  # ~25 s on an idle 2-core machine, several times that under load


def _not_installed_reason() -> str | None:
    if not (VENV / ".eaglegen-installed").is_file():
        why = SETUP_FAILED.read_text().strip() if SETUP_FAILED.is_file() else "not set up"
        return f"vLLM CPU server not installed in {VENV.name} ({why}); run make test-vllm"
    if not (MODEL_DIR / "eaglegen_path.json").is_file():
        return f"tiny model missing in {MODEL_DIR}; run scripts/setup_vllm.sh"
    return None


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    reason = _not_installed_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the vLLM tier: {reason}")
    pytest.skip(reason)


@dataclass
class Server:
    """A running vLLM server and what the tiny model it serves will answer."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    started_s: float
    reasoning: str
    answer: str

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1"

    def gauges(self) -> dict[str, float]:
        """``vllm:*`` gauges from ``/metrics``, labels dropped."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        found = re.findall(r"^(vllm:\w+)\{[^}]*\} ([0-9.eE+-]+)$", text, re.MULTILINE)
        return {name: float(value) for name, value in found}

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _server_env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a large share of RAM
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",  # usage reporting would reach outside loopback
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",  # the engine's internal sockets stay on loopback too
    }


def start_server(log: Path, *options: str) -> Server:
    """Start vLLM in its own process group and wait until ``/health`` answers."""
    port = free_port()
    args = [
        str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL_DIR), "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--reasoning-parser", "qwen3",
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
        *options,
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=ROOT, env=_server_env(), stdout=out, stderr=out, start_new_session=True
        )
    path = json.loads((MODEL_DIR / "eaglegen_path.json").read_text())
    server = Server(f"http://127.0.0.1:{port}", proc, log, 0.0, path["reasoning"], path["answer"])
    try:
        wait_for(
            lambda: _healthy(server), START_TIMEOUT, lambda: f"vLLM /health\n{server.log_tail()}"
        )
    except BaseException:
        stop_server(server)
        raise
    server.started_s = round(time.monotonic() - started, 1)
    return server


def _healthy(server: Server) -> bool:
    if server.proc.poll() is not None:
        pytest.fail(f"vLLM exited with {server.proc.returncode}:\n{server.log_tail()}")
    try:
        return httpx.get(f"{server.url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stop_server(server: Server, grace_s: float = 30) -> None:
    """SIGTERM the server (it stops its engine), then SIGKILL its process group if need be."""
    with contextlib.suppress(ProcessLookupError):
        server.proc.send_signal(signal.SIGTERM)
        if not _group_gone(server.proc, grace_s):
            os.killpg(server.proc.pid, signal.SIGKILL)  # the group id is the server's pid
            _group_gone(server.proc, grace_s)
    server.proc.wait()


def _group_gone(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()  # reap the server: a zombie still counts as a member of its group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="session")
def vllm_server(vllm_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tier's main server: default scheduling limits."""
    server = start_server(tmp_path_factory.mktemp("vllm") / "server.log")
    report(f"vLLM server ready in {server.started_s} s")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def redis_url() -> str:
    from tests.integration.conftest import reachable_redis

    return reachable_redis("EAGLEGEN_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")


@pytest.fixture
def stack(procs: Procs, redis_url: str, rdb: redis.Redis, tmp_path: Path) -> Stack:  # noqa: F811
    """The integration harness's stack, with timeouts for a real server on a busy machine."""
    s = Stack(procs, redis_url, tmp_path)
    s.env["EAGLEGEN_STALL_TIMEOUT"] = "120"  # a 2-core machine may queue a stream that long
    s.env["EAGLEGEN_LEASE_TTL"] = "30"
    return s


_REPORT: list[str] = []


def report(line: str) -> None:
    """A measurement shown at the end of the run (timings for the issue's closing note)."""
    _REPORT.append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _REPORT:
        terminalreporter.section("vLLM tier measurements")
        for line in _REPORT:
            terminalreporter.write_line(line)
