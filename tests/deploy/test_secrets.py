"""A run with a known API key and Redis password leaves neither anywhere a person can read.

Searched: every log file, every command's output (failing ones too), the Celery messages in
Redis while queued and while unacked, everything left in Redis, every Flower page and API
answer, the processes' command lines, and the JSONL.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import redis

from common.store import RunStore
from tests.deploy.redis_servers import RedisServers
from tests.harness import CLI, Procs, child_env, free_port, wait_for
from tests.stack import Stack

pytestmark = pytest.mark.integration

API_KEY = "sk-eaglegen-4f1d9c2b7a"
PASSWORD = "redis-pw-6e0b44d1a9"
FLOWER_AUTH = ("admin", "flower-pw-19b2")
DATATABLE = "/tasks/datatable?draw=1&start=0&length=100&order[0][column]=0&columns[0][data]=name"


class KeyEchoingServer(BaseHTTPRequestHandler):
    """An endpoint that refuses the key and quotes it back, as some proxies do."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        body = {"error": {"message": f"Incorrect API key provided: {token}", "code": 401}}
        payload = json.dumps(body).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeyEchoingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def start_flower(procs: Procs, env: dict[str, str]) -> str:
    """Flower as docker-compose.yml starts it: same app config, basic auth from the env."""
    port = free_port()
    args = [sys.executable, "-m", "celery", "-A", "worker.celery_app", "flower",
            "--address=127.0.0.1", f"--port={port}"]  # fmt: skip
    procs.start_program("flower", args, {**env, "FLOWER_BASIC_AUTH": ":".join(FLOWER_AUTH)})
    return f"http://127.0.0.1:{port}"


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def run_cli(commands: list[tuple[list[str], dict[str, str]]], cwd: Path) -> list[str]:
    """Run CLI commands side by side (each pays Python's start-up); their stdout + stderr."""
    running = [
        subprocess.Popen([*CLI, *args], cwd=cwd, env=child_env(env),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for args, env in commands
    ]  # fmt: skip
    return [proc.communicate(timeout=60)[0] for proc in running]


def queued_messages(client: redis.Redis, queue: str) -> list[str]:
    """Celery messages waiting in the queue, raw and with their base64 bodies decoded."""
    # kombu keeps one list per priority step: the queue's name, then a separator and the step.
    lists = [k for k in client.scan_iter(match=f"{queue}*") if client.type(k) == "list"]
    return _with_bodies([str(m) for key in lists for m in client.lrange(key, 0, -1)])


def unacked_messages(client: redis.Redis) -> list[str]:
    return _with_bodies([str(m) for m in client.hvals("unacked")])


def _with_bodies(raw: list[str]) -> list[str]:
    decoded = []
    for text in raw:
        message = json.loads(text)
        message = message[0] if isinstance(message, list) else message
        decoded.append(base64.b64decode(message["body"]).decode())
    return raw + decoded


def everything_in(client: redis.Redis) -> list[str]:
    """Every key and value left in the database."""
    found: list[str] = []
    for key in client.scan_iter(count=500):
        kind = client.type(key)
        found.append(str(key))
        if kind == "string":
            found.append(str(client.get(key)))
        elif kind == "hash":
            found += [f"{k}={v}" for k, v in client.hgetall(key).items()]
        elif kind == "list":
            found += [str(v) for v in client.lrange(key, 0, -1)]
        elif kind == "set":
            found += [str(v) for v in client.smembers(key)]
        elif kind == "zset":
            found += [str(v) for v in client.zrange(key, 0, -1)]
    return found


def flower_pages(url: str, worker: str, task_id: str) -> list[str]:
    auth = httpx.BasicAuth(*FLOWER_AUTH)
    paths = ["/", "/workers", f"/worker/{worker}", "/tasks", DATATABLE, "/broker",
             f"/task/{task_id}", "/api/workers?refresh=1", "/api/tasks",
             f"/api/task/info/{task_id}", "/metrics", "/healthcheck"]  # fmt: skip
    pages = []
    for path in paths:
        response = httpx.get(url + path, auth=auth, timeout=30)
        assert response.status_code == 200, (path, response.status_code)
        pages.append(f"{path}: {response.text}")
    return pages


def assert_no_secret(texts: dict[str, list[str]]) -> None:
    # Terminal output wraps long lines: a secret cut by a line break must still be found.
    joined = {where: [t.replace("\n", "") for t in items] for where, items in texts.items()}
    leaks = [
        f"{where}: ...{text[max(text.find(s) - 120, 0):text.find(s) + 40]}..."
        for where, items in joined.items() for text in items for s in (API_KEY, PASSWORD)
        if s in text
    ]  # fmt: skip
    assert not leaks, "secrets leaked:\n" + "\n".join(leaks)


def run_two_runs(stack: Stack, refused: dict[str, str], flower_url: str) -> dict[str, list[str]]:
    """One run that succeeds and one whose endpoint quotes the key back; what they exposed."""
    source = stack.tmp / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"secret-free {i}"}) + "\n" for i in range(6)))
    outputs = run_cli([(["enqueue", str(source)], stack.env),
                       (["enqueue", str(source), "--limit", "1"], refused)], stack.tmp)  # fmt: skip
    client = stack.store.r
    queued = [*queued_messages(client, stack.env["EAGLEGEN_QUEUE"]),
              *queued_messages(client, refused["EAGLEGEN_QUEUE"])]  # fmt: skip
    assert len(queued) == 14  # seven messages, each raw and decoded
    wait_for(lambda: _answers(f"{flower_url}/healthcheck"), 30, "Flower to answer /healthcheck")
    assert httpx.get(flower_url + "/", timeout=10).status_code == 401
    stack.worker(concurrency=3)
    stack.procs.start("worker-refused", ["worker", "--concurrency", "1"], refused)
    wait_for(lambda: client.hlen("unacked") > 0, 30, "a message in flight")
    unacked = unacked_messages(client)
    stack.collector()
    stack.wait_complete(timeout=60)
    failed = RunStore(client, stack.settings.key_prefix, "refused")
    wait_for(lambda: failed.counts().failed == 1, 30, "the refused sample to fail")
    assert KeyEchoingServer.seen and all(h == f"Bearer {API_KEY}" for h in KeyEchoingServer.seen)
    return {"command output": outputs, "queued messages": queued, "unacked messages": unacked}


def status_commands(stack: Stack, port: int) -> list[str]:
    """`status` of the failed run, of a run that does not exist, of a Redis that is down and
    as a user that does not exist; all with the known password in the URL."""
    closed = {**stack.env, "EAGLEGEN_REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"}
    stranger = {**stack.env, "EAGLEGEN_REDIS_URL": f"redis://nobody:{PASSWORD}@127.0.0.1:{port}/0"}
    outputs = run_cli([
        (["status", "--run", "refused"], stack.env), (["status", "--run", "nothing"], stack.env),
        (["status"], closed), (["status"], stranger),
    ], stack.tmp)  # fmt: skip
    assert "auth" in outputs[0]  # the failure's kind, next to its (redacted) reason
    assert "no run named 'nothing' in redis://:***@" in outputs[1]
    assert "cannot reach Redis at redis://:***@" in outputs[2]
    assert "cannot reach Redis at redis://nobody:***@" in outputs[3]
    return outputs


def flower_answers(url: str) -> list[str]:
    """Every Flower page and API answer, while the workers still reply to inspection."""
    auth = httpx.BasicAuth(*FLOWER_AUTH)
    seen: dict[str, dict[str, object]] = {}

    def both_workers_and_all_tasks() -> bool:
        seen["workers"] = httpx.get(f"{url}/api/workers?refresh=1", auth=auth, timeout=30).json()
        seen["tasks"] = httpx.get(f"{url}/api/tasks", auth=auth, timeout=30).json()
        return len(seen["workers"]) == 2 and len(seen["tasks"]) == 7

    wait_for(both_workers_and_all_tasks, 30, lambda: f"Flower to see 2 workers, 7 tasks: {seen}")
    return flower_pages(url, next(iter(seen["workers"])), next(iter(seen["tasks"])))


def test_no_secret_reaches_logs_outputs_messages_flower_or_the_jsonl(
    servers: RedisServers, procs: Procs, tmp_path: Path, echo_endpoint: str
):  # fmt: skip
    port = servers.start("--requirepass", PASSWORD)
    stack = Stack(procs, f"redis://:{PASSWORD}@127.0.0.1:{port}/0", tmp_path)
    stack.env["EAGLEGEN_API_KEY"] = API_KEY
    # Flower's task pages need task events from the workers' start, as docker-compose.yml sets.
    stack.env["EAGLEGEN_TASK_EVENTS"] = "true"
    refused = {**stack.env, "EAGLEGEN_RUN": "refused", "EAGLEGEN_QUEUE": "q-refused",
               "EAGLEGEN_ENDPOINTS": echo_endpoint}  # fmt: skip
    flower_url = start_flower(procs, stack.env)  # starts while the rest starts
    stack.simulator("--time-per-token", "0.01")
    exposed = run_two_runs(stack, refused, flower_url)
    exposed["command output"] += status_commands(stack, port)
    exposed["flower"] = flower_answers(flower_url)
    procs.stop_all()
    exposed["logs"] = [p.read_text() for p in tmp_path.glob("*.log")]
    exposed["redis"] = everything_in(stack.store.r)
    exposed["command lines"] = [" ".join(map(str, p.args)) for p in procs.procs]
    exposed["jsonl"] = [stack.out.read_text()]
    assert_no_secret(exposed)
