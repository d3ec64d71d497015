"""A real vLLM CPU server (``scripts/setup_vllm.sh``) serving the tiny Qwen3 built at set-up.

The server runs in its own venv and process group on loopback, started from the harness's
known environment; stopping it SIGTERMs the server (it stops its engine), then SIGKILLs its
group if need be.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.harness import ROOT, Child, ChildExited, Procs, free_port, wait_for

VENV = ROOT / os.environ.get("EAGLEGEN_VLLM_VENV", ".vllm-venv")
MODEL_DIR = ROOT / os.environ.get("EAGLEGEN_VLLM_MODEL", ".eaglegen/tiny-qwen3")
SETUP_FAILED = ROOT / ".eaglegen" / "vllm-setup.failed"
MODEL_NAME = "tiny-qwen3"
MAX_MODEL_LEN = 2048
START_TIMEOUT = 300  # ~25 s on an idle 2-core machine, several times that under load
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a large share of RAM
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",  # usage reporting would reach outside loopback
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",  # the engine's internal sockets stay on loopback too
    # The engine's stats line every second (default 10 s): the metrics tests read it as a
    # second view of the scheduler beside /metrics, whose gauges lag by seconds.
    "VLLM_LOG_STATS_INTERVAL": "1",
}


def not_installed_reason() -> str | None:
    """Why the tier cannot run here, or None."""
    if not (VENV / ".eaglegen-installed").is_file():
        why = SETUP_FAILED.read_text().strip() if SETUP_FAILED.is_file() else "not set up"
        return f"vLLM CPU server not installed in {VENV.name} ({why}); run make test-vllm"
    if not (MODEL_DIR / "eaglegen_path.json").is_file():
        return f"tiny model missing in {MODEL_DIR}; run scripts/setup_vllm.sh"
    return None


@dataclass
class Server:
    """A running vLLM server and what the tiny model it serves will answer."""

    url: str
    proc: Child
    procs: Procs
    started_s: float
    reasoning: str
    answer: str

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1"

    def generated(self) -> float:
        """Tokens the server has generated since it started (``generation_tokens_total``)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        found = re.findall(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.eE+-]+)$", text,
                           re.MULTILINE)  # fmt: skip
        return sum(float(x) for x in found)

    def gauges(self) -> dict[str, float]:
        """``vllm:*`` gauges from ``/metrics``, labels dropped."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        found = re.findall(r"^(vllm:\w+)\{[^}]*\} ([0-9.eE+-]+)$", text, re.MULTILINE)
        return {name: float(value) for name, value in found}

    def log_tail(self, chars: int = 4000) -> str:
        return self.procs.logs(chars)

    def logged_load(self) -> list[tuple[float, float]]:
        """(running, waiting) from every stats line the server logged so far."""
        text = self.procs.logs(10**9)
        found = re.findall(r"Running: (\d+) reqs, Waiting: (\d+) reqs", text)
        return [(float(r), float(w)) for r, w in found]

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise ChildExited(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def start_server(logs: Path, *options: str, model: Path = MODEL_DIR) -> Server:
    """Start vLLM (logging into the folder ``logs``) and wait until ``/health`` answers."""
    port = free_port()
    args = [
        str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--reasoning-parser", "qwen3",
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
        *options,
    ]  # fmt: skip
    started = time.monotonic()
    procs = Procs(logs, grace=30, own_group=True)
    proc = procs.start_program("vllm-server", args, SERVER_ENV)
    path = json.loads((model / "eaglegen_path.json").read_text())
    server = Server(f"http://127.0.0.1:{port}", proc, procs, 0.0, path["reasoning"], path["answer"])
    try:
        wait_for(server.healthy, START_TIMEOUT, lambda: f"vLLM /health\n{server.log_tail()}")
    except BaseException:
        stop_server(server)
        raise
    server.started_s = round(time.monotonic() - started, 1)
    return server


def engine_behind_api_server(server: Server, niceness: int = 19) -> list[int]:
    """Put the server's engine processes (every descendant of the API server) on the API
    server's core at the lowest priority: the engine's pids.

    On a GPU node the engine computes on the GPU and the API server has a core of its own to
    turn outputs into stream events as fast as they come. On two shared cores the tiny model's
    engine runs ahead of the API server (tokens generated that no one was sent yet), and a
    killed client's unsent tokens then count as waste that a real node would not have. Sharing
    the API server's core below its priority, the engine computes only while the API server
    has nothing left to send.
    """
    pids, todo = [], [server.proc.pid]
    while todo:
        pid = todo.pop()
        found = [int(c) for t in _threads(pid) for c in _read(f"/proc/{pid}/task/{t}/children")]
        todo += found
        pids += found
    core = {min(os.sched_getaffinity(server.proc.pid))}
    for pid in [server.proc.pid, *pids]:
        for tid in _threads(pid):  # Linux keeps affinity and niceness per thread
            os.sched_setaffinity(tid, core)
            if pid != server.proc.pid:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
    return pids


def _threads(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(task.name) for task in tasks.iterdir()] if tasks.exists() else []


def _read(path: str) -> list[str]:
    return Path(path).read_text().split() if Path(path).exists() else []


def stop_server(server: Server) -> None:
    """SIGTERM the server; SIGKILL its process group if any of it outlives 30 s."""
    server.procs.stop_all()


_REPORT: list[str] = []


def report(line: str) -> None:
    """A measurement shown at the end of the run (timings for the issue's closing note)."""
    _REPORT.append(line)


def reported() -> list[str]:
    """The measurements reported so far."""
    return list(_REPORT)
