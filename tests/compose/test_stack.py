"""`make up` for real: the docker stack on a docker engine, driven as a user drives it.

Run by `make test-compose` (scripts/test_compose.sh provides the engine and base images).
One scenario, in the order a run lives: up with two workers, Flower behind its password,
.env settings inside the containers, scale 2 -> 3 -> 2, the bundled prompts through the
producer service, `make down` mid-run and `make up` again, every prompt exactly once in the
collector's JSONL, then `make down ARGS=-v` leaving nothing. The stack runs in a copy of the
repository with a .env of its own (the developer's .env, ./out and Redis are never touched),
under a project name of its own, with Redis and Flower on free loopback ports.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.deploy.test_compose import compose_command
from tests.harness import ROOT, free_port

pytestmark = pytest.mark.compose

PROMPTS = ("mt_bench_question.jsonl", "vicuna_bench_question.jsonl")  # 80 + 80
SAMPLES = 160
RUN = "compose-test"
OUT_OWNER = 4242  # ./out's owner: the collector must write as this uid, not as root
SIM = "http://simulator:8000/v1"
# A setting of each kind, set in .env only, and the value Settings() must read in a container.
SETTINGS = {
    "EAGLEGEN_MAX_RETRIES": ("7", "max_retries", 7),
    "EAGLEGEN_STALL_TIMEOUT": ("240.5", "stall_timeout", 240.5),
    "EAGLEGEN_ADAPTIVE": ("true", "adaptive", True),
    "EAGLEGEN_ENDPOINTS": (SIM, "endpoints", [SIM]),
    "EAGLEGEN_ENDPOINT_CAPS": (f"{SIM}=48", "endpoint_caps", {SIM: 48}),
    "EAGLEGEN_RPM": ("100000", "rpm", 100000),
    "EAGLEGEN_CONCURRENCY": ("3", "concurrency", 3),  # 6-9 in flight: a run of about a minute
}
# What the caller's environment must not bring in: the stack reads its .env and nothing else.
FOREIGN = ("EAGLEGEN_", "REDIS_", "FLOWER_", "COMPOSE_", "PYTHON_IMAGE", "PIP_INDEX_URL")
# The repository minus what is the developer's own (or big, or irrelevant to the image).
NOT_COPIED = (".git", ".venv", "out", ".env", "tls", ".eaglegen", "bench", "__pycache__",
              ".*_cache", "*.egg-info")  # fmt: skip


class Stack:
    """The copy of the repository the stack runs from, and the commands a user would type."""

    def __init__(self, root: Path, project: str, flower_port: int, auth: str) -> None:
        self.root, self.project, self.flower_port, self.auth = root, project, flower_port, auth
        self.compose = compose_command()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
        self.env["DOCKER_COMPOSE"] = " ".join(self.compose)
        self.timings: dict[str, float] = {}

    def run(self, *argv: str, timeout: float = 300) -> str:
        result = subprocess.run(argv, cwd=self.root, env=self.env, capture_output=True,
                                text=True, timeout=timeout)  # fmt: skip
        assert result.returncode == 0, f"{' '.join(argv)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def make(self, *args: str, timeout: float = 600) -> str:
        return self.run("make", "--no-print-directory", *args, timeout=timeout)

    def dc(self, *args: str, timeout: float = 300) -> str:
        """docker compose (v2 or v1, as the Makefile picks) in the copy, its .env only."""
        return self.run(*self.compose, *args, timeout=timeout)

    def ids(self, service: str) -> list[str]:
        return sorted(self.dc("ps", "-q", service).split())

    def exec(self, cid: str, *argv: str) -> str:
        return self.run("docker", "exec", cid, *argv, timeout=60)

    def timed(self, name: str, step: Callable[[], object]) -> None:
        start = time.monotonic()
        step()
        self.timings[name] = round(time.monotonic() - start, 1)
        print(f"test-compose: {name} {self.timings[name]} s", flush=True)

    def jsonl_ids(self) -> list[str]:
        out = self.root / "out" / f"{RUN}.jsonl"
        lines = out.read_text().splitlines() if out.exists() else []
        return [json.loads(line)["id"] for line in lines if line.strip()]

    def status(self) -> dict[str, object]:
        (collector,) = self.ids("collector")
        return json.loads(self.exec(collector, "eaglegen", "status", "--json"))  # type: ignore[no-any-return]

    def labelled(self, kind: str) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        if kind == "container":
            return self.run("docker", "ps", "-aq", "--filter", label).split()
        return self.run("docker", kind, "ls", "-q", "--filter", label).split()

    def logs(self) -> str:
        result = subprocess.run([*self.compose, "logs", "--tail=40", "--no-color"],
                                cwd=self.root, env=self.env, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        return result.stdout[-20000:]


def wait_for(what: str, check: Callable[[], bool], timeout: float, every: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def require_docker() -> None:
    """A running engine: skip without one, fail in CI (make test-compose provides it)."""
    ok = shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True,
                                                    timeout=60).returncode == 0  # fmt: skip
    if not ok:
        if os.environ.get("CI"):
            pytest.fail("no docker engine answers `docker info` (run make test-compose)")
        pytest.skip("no docker engine (make test-compose installs and starts one)")


def write_env(root: Path, project: str, redis_port: int, flower_port: int, auth: str) -> None:
    lines = {
        "COMPOSE_PROJECT_NAME": project, "COMPOSE_PROFILES": "demo",
        "REDIS_PASSWORD": secrets.token_hex(16), "FLOWER_BASIC_AUTH": auth,
        "REDIS_PORT": str(redis_port), "FLOWER_PORT": str(flower_port),
        "EAGLEGEN_IMAGE": "eaglegen-compose-test:latest", "EAGLEGEN_RUN": RUN,
        "EAGLEGEN_API_KEY": "sk-compose-" + secrets.token_hex(8),
        **{name: value for name, (value, _, _) in SETTINGS.items()},
    }  # fmt: skip
    for base in ("PYTHON_IMAGE", "REDIS_IMAGE"):  # set by scripts/test_compose.sh when local
        if os.environ.get(base):
            lines[base] = os.environ[base]
    (root / ".env").write_text("".join(f"{k}={v}\n" for k, v in lines.items()))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    require_docker()
    root = tmp_path / "eaglegen"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(*NOT_COPIED))
    project = os.environ.get("EAGLEGEN_COMPOSE_PROJECT") or f"egtest{secrets.token_hex(4)}"
    auth = f"admin:{secrets.token_hex(8)}"
    flower_port = free_port()
    write_env(root, project, free_port(), flower_port, auth)
    (root / "out").mkdir()
    os.chown(root / "out", OUT_OWNER, OUT_OWNER)
    stack = Stack(root, project, flower_port, auth)
    try:
        yield stack
    finally:
        # Whatever happened: nothing of the test's project keeps running or stays on disk.
        subprocess.run([*stack.compose, "down", "-v", "--remove-orphans", "--timeout", "10"],
                       cwd=root, env=stack.env, capture_output=True, timeout=300)  # fmt: skip
        print(f"test-compose timings (s): {json.dumps(stack.timings)}", flush=True)


def flower_status(stack: Stack, auth: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{stack.flower_port}/")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def settings_in(stack: Stack, cid: str) -> dict[str, object]:
    script = "from common.settings import Settings; print(Settings().model_dump_json())"
    return json.loads(stack.exec(cid, "python", "-c", script))  # type: ignore[no-any-return]


def env_in(stack: Stack, cid: str) -> dict[str, str]:
    out = stack.run("docker", "inspect", "-f", "{{json .Config.Env}}", cid)
    return dict(item.split("=", 1) for item in json.loads(out))


def check_settings_reach_the_containers(stack: Stack) -> None:
    worker = stack.ids("worker")[0]
    seen = settings_in(stack, worker)
    for name, (_, field, expected) in SETTINGS.items():
        assert seen[field] == expected, (name, seen[field])
    (collector,) = stack.ids("collector")
    assert settings_in(stack, collector)["stall_timeout"] == 240.5  # every role, not only workers
    # The API key only in the workers, Flower's password only in Flower.
    key = env_in(stack, worker)["EAGLEGEN_API_KEY"]
    assert key.startswith("sk-compose-")
    for service in ("collector", "flower", "simulator"):
        env = env_in(stack, stack.ids(service)[0])
        assert key not in env.values(), service
        assert (env.get("FLOWER_BASIC_AUTH") == stack.auth) == (service == "flower"), service


def check_non_root(stack: Stack) -> None:
    """Every process but the init of the collector and Redis (which drop root) is non-root."""
    for cid in stack.run("docker", "ps", "-q", "--filter",
                         f"label=com.docker.compose.project={stack.project}").split():  # fmt: skip
        rows = stack.run("docker", "top", cid, "-eo", "pid,uid,args").splitlines()[1:]
        for row in rows:
            _, uid, args = row.split(None, 2)
            if "docker-init" not in args:
                assert uid not in ("0", "root"), (cid, row)
    (collector,) = stack.ids("collector")
    rows = stack.run("docker", "top", collector, "-eo", "pid,uid,args").splitlines()[1:]
    assert any(r.split()[1] == str(OUT_OWNER) and "collect" in r for r in rows), rows


def check_flower(stack: Stack) -> None:
    wait_for("Flower", lambda: flower_status(stack, None) == 401, 120)
    assert flower_status(stack, stack.auth) == 200
    assert flower_status(stack, "admin:wrong") == 401


def scale_to_3_then_2_keeps_the_collector(stack: Stack) -> None:
    collector = stack.ids("collector")
    # Plain compose, as docs/deployment.md shows: no variable from make, same collector.
    stack.dc("up", "-d", "--scale", "worker=3", timeout=300)
    assert len(stack.ids("worker")) == 3
    wait_for("20 lines", lambda: len(stack.jsonl_ids()) >= 20, 300)
    stack.make("up", "WORKERS=2")  # mid-run: the removed worker hands its samples back
    assert len(stack.ids("worker")) == 2
    assert stack.ids("collector") == collector


def down_mid_run_and_up_again(stack: Stack) -> None:
    wait_for("40 lines", lambda: len(stack.jsonl_ids()) >= 40, 300)
    stack.make("down", timeout=300)
    assert not stack.run("docker", "ps", "-q", "--filter",
                         f"label=com.docker.compose.project={stack.project}").split()  # fmt: skip
    written = len(stack.jsonl_ids())
    assert written < SAMPLES, "the run finished before `make down`: nothing was interrupted"
    print(f"test-compose: make down with {written}/{SAMPLES} lines written", flush=True)
    stack.make("up", "WORKERS=2", timeout=600)


def run_completes_exactly_once(stack: Stack) -> None:
    wait_for("the run to complete", lambda: stack.status().get("complete") is True, 600, 3)
    status = stack.status()
    assert (status["total"], status["done"], status["failed"]) == (SAMPLES, SAMPLES, 0)
    ids = stack.jsonl_ids()
    assert len(ids) == SAMPLES and len(set(ids)) == SAMPLES


def enqueue_and_run(stack: Stack) -> None:
    for source in PROMPTS:
        stack.make("enqueue", f"SOURCE={source}", timeout=300)
    scale_to_3_then_2_keeps_the_collector(stack)
    down_mid_run_and_up_again(stack)
    run_completes_exactly_once(stack)


@pytest.mark.timeout(840)  # the build alone may take minutes on a clean machine
def test_make_up_runs_the_stack_end_to_end(stack: Stack):
    try:
        scenario(stack)
    except BaseException:
        print(stack.logs())
        raise


def scenario(stack: Stack) -> None:
    stack.timed("build", lambda: stack.dc("build", timeout=900))
    stack.timed("up", lambda: stack.make("up", "WORKERS=2"))
    assert len(stack.ids("worker")) == 2
    check_flower(stack)
    check_settings_reach_the_containers(stack)
    check_non_root(stack)
    stack.timed("job", lambda: enqueue_and_run(stack))
    stack.make("down", "ARGS=-v", timeout=300)
    for kind in ("container", "volume", "network"):
        assert not stack.labelled(kind), kind
