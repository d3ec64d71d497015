"""The compose files: valid for docker compose, and safe and scalable as written.

No docker engine runs here, so the stack is never started: `docker compose config` (or the
standalone docker-compose) validates the files, and the YAML itself is checked for what a
review would look for.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import ROOT, child_env
from tests.services import unavailable

MAIN, TLS, WORKER = "docker-compose.yml", "docker-compose.tls.yml", "docker-compose.worker.yml"
LONG_RUNNING = ("redis", "worker", "collector", "flower", "simulator")
EAGLEGEN_IMAGE = ("worker", "collector", "flower", "producer", "simulator")
SECRET_NAME = re.compile(r"PASSWORD|AUTH|KEY|SECRET|TOKEN")
TEST_ENV = {
    "REDIS_PASSWORD": "compose-test-pw", "FLOWER_BASIC_AUTH": "admin:compose-test",
    "EAGLEGEN_REDIS_URL": "redis://:pw@main-host:6379/0", "EAGLEGEN_ENDPOINTS": "http://g:8000/v1",
    "COMPOSE_PROFILES": "demo,producer",
}  # fmt: skip


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())  # type: ignore[no-any-return]


def with_defaults(text: str) -> str:
    """``${VAR:-default}`` -> default, ``${VAR:?why}`` -> <VAR>, as with nothing set."""
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", text)
    return re.sub(r"\$\{(\w+)(:?\?[^}]*)?\}", r"<\1>", text)


def compose_command() -> list[str]:
    """The docker compose plugin, else the standalone docker-compose; skip (fail in CI)."""
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone:
        return [standalone]
    unavailable("neither the docker compose plugin nor docker-compose is installed")


def compose_config(
    files: list[str], env: dict[str, str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    env_file = tmp / "test.env"  # never the developer's own .env
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    args = [*compose_command(), "--env-file", str(env_file)]
    for name in files:
        args += ["-f", str(ROOT / name)]
    return subprocess.run(
        [*args, "config"], cwd=ROOT, env=child_env(), capture_output=True, text=True
    )


@pytest.mark.parametrize("files", [[MAIN], [MAIN, TLS], [WORKER]], ids=["main", "tls", "worker"])
def test_docker_compose_config_accepts_each_stack(files: list[str], tmp_path: Path):
    result = compose_config(files, TEST_ENV, tmp_path)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert set(services) == ({"worker"} if files == [WORKER] else {*LONG_RUNNING, "producer"})


@pytest.mark.parametrize("missing", ["REDIS_PASSWORD", "FLOWER_BASIC_AUTH"])
def test_the_stack_will_not_start_without_its_secrets(missing: str, tmp_path: Path):
    env = {k: v for k, v in TEST_ENV.items() if k != missing}
    result = compose_config([MAIN], env, tmp_path)
    assert result.returncode != 0
    assert f"set {missing}" in result.stderr


def test_a_worker_host_will_not_start_without_the_main_hosts_redis_url(tmp_path: Path):
    env = {k: v for k, v in TEST_ENV.items() if k != "EAGLEGEN_REDIS_URL"}
    result = compose_config([WORKER], env, tmp_path)
    assert result.returncode != 0 and "EAGLEGEN_REDIS_URL" in result.stderr


def test_published_ports_are_on_loopback_unless_the_user_says_otherwise():
    for name in (MAIN, TLS, WORKER):
        for service, spec in load(name)["services"].items():
            for port in spec.get("ports", []):
                assert with_defaults(str(port)).startswith("127.0.0.1:"), (name, service, port)


def test_every_long_running_service_has_a_health_check_and_a_restart_policy():
    services = load(MAIN)["services"]
    dockerfile_checks = "HEALTHCHECK" in (ROOT / "Dockerfile").read_text()
    for name in LONG_RUNNING:
        spec = services[name]
        assert spec["restart"] == "unless-stopped", name
        assert "healthcheck" in spec or (name in EAGLEGEN_IMAGE and dockerfile_checks), name
    assert services["producer"]["restart"] == "no"
    assert load(WORKER)["services"]["worker"]["healthcheck"]


def test_redis_keeps_every_queued_sample_aof_every_second_and_never_evicts():
    for name in (MAIN, TLS):
        command = " ".join(load(name)["services"]["redis"]["command"])
        for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory ",
                     "--maxmemory-policy noeviction"):  # fmt: skip
            assert flag in command, (name, flag)


def test_no_secret_is_written_in_a_compose_file():
    for name in (MAIN, TLS, WORKER):
        text = (ROOT / name).read_text()
        assert "compose-test" not in text
        for service, spec in load(name)["services"].items():
            for key, value in (spec.get("environment") or {}).items():
                if SECRET_NAME.search(key) or "redis" in str(value):
                    assert _only_references(str(value)), (name, service, key, value)
        # The Redis password reaches redis-server through a file, not its command line.
        assert "--requirepass" not in text


def _only_references(value: str) -> bool:
    """Whether every password-like part of ``value`` is a ${VAR} reference."""
    secrets = re.findall(r"://[^:@/]*:([^@]+)@", value) if "://" in value else [value]
    return all(s == "" or re.fullmatch(r"\$\{\w+(:[-?][^}]*)?\}", s) for s in secrets)


def test_workers_scale_because_nothing_pins_one_container():
    for name in (MAIN, WORKER):
        worker = load(name)["services"]["worker"]
        assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    # network_mode: host would give every scaled worker the same Celery node name.
    assert "network_mode" not in load(WORKER)["services"]["worker"]


def test_flower_runs_from_the_workers_app_config_behind_basic_auth():
    services = load(MAIN)["services"]
    flower = services["flower"]
    assert flower["entrypoint"] == ["celery", "-A", "worker.celery_app", "flower"]
    assert ":?" in flower["environment"]["FLOWER_BASIC_AUTH"]
    broker = ("EAGLEGEN_REDIS_URL", "EAGLEGEN_MAX_REQUEST_TIME", "EAGLEGEN_BACKOFF_MAX",
              "EAGLEGEN_VISIBILITY_TIMEOUT")  # fmt: skip
    for name in ("worker", "collector", "producer"):
        for key in broker:
            assert services[name]["environment"][key] == flower["environment"][key], (name, key)


def test_only_the_workers_get_the_api_key():
    services = load(MAIN)["services"]
    holders = {
        name
        for name, spec in services.items()
        if "EAGLEGEN_API_KEY" in (spec.get("environment") or {})
    }
    assert holders == {"worker"}


def test_the_collector_writes_to_a_mounted_directory():
    collector = load(MAIN)["services"]["collector"]
    out = collector["command"][collector["command"].index("--out") + 1]
    mounts = [with_defaults(v).split(":") for v in collector["volumes"]]
    assert any(out.startswith(target + "/") for _, target, *_ in mounts)


def test_the_producer_and_the_simulator_start_only_with_their_profiles():
    services = load(MAIN)["services"]
    assert services["producer"]["profiles"] == ["producer"]
    assert services["simulator"]["profiles"] == ["demo"]


def test_make_up_scales_the_workers():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    dry = subprocess.run([make, "-n", "up", "WORKERS=4"], cwd=ROOT, capture_output=True, text=True)
    assert "up -d --build --scale worker=4" in dry.stdout, dry.stdout + dry.stderr
