"""The compose files: valid for docker compose, and safe and scalable as written.

`docker compose config` (or the standalone docker-compose) validates the files and resolves
what each container gets, and the YAML itself is checked for what a review would look for.
The stack itself runs in tests/compose (make test-compose).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.settings import Settings
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
    env_file = tmp / "test.env"  # never the developer's own .env, for ${} and env_file alike
    env = {**env, "EAGLEGEN_ENV_FILE": str(env_file)}
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
    for name in ("worker", "collector", "producer"):
        spec = services[name]
        assert spec["env_file"] == flower["env_file"], name  # visibility timeout and the rest
        assert (
            spec["environment"]["EAGLEGEN_REDIS_URL"] == flower["environment"]["EAGLEGEN_REDIS_URL"]
        )


# A setting of each kind, as .env spells it, and what Settings() makes of it.
KINDS = {
    "EAGLEGEN_MAX_RETRIES": ("7", "max_retries", 7),
    "EAGLEGEN_STALL_TIMEOUT": ("240.5", "stall_timeout", 240.5),
    "EAGLEGEN_ADAPTIVE": ("true", "adaptive", True),
    "EAGLEGEN_RPM": ("600", "rpm", 600),
    "EAGLEGEN_ENDPOINT_CAPS": ("http://g:8000/v1=32", "endpoint_caps", {"http://g:8000/v1": 32}),
    "EAGLEGEN_METRICS_PORT": ("9100", "metrics_port", 9100),
    "EAGLEGEN_VISIBILITY_TIMEOUT": ("5000", "visibility_timeout", 5000),
}
ENDPOINTS = "http://g1:8000/v1,http://g2:8000/v1"


def resolved(files: list[str], env: dict[str, str], tmp: Path) -> dict[str, Any]:
    result = compose_config(files, env, tmp)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("files", [[MAIN], [WORKER]], ids=["main", "worker"])
def test_every_setting_in_env_reaches_the_containers_that_use_it(files: list[str], tmp_path: Path):
    env = {**TEST_ENV, "EAGLEGEN_ENDPOINTS": ENDPOINTS,
           **{name: value for name, (value, _, _) in KINDS.items()}}  # fmt: skip
    services = resolved(files, env, tmp_path)
    for name in {"worker", "collector", "flower", "producer"} & set(services):
        container_env = {k: str(v) for k, v in services[name]["environment"].items()}
        settings = Settings(_env_file=None, **_as_fields(container_env))
        for var, (_, field, expected) in KINDS.items():
            assert getattr(settings, field) == expected, (name, var)
    assert Settings(**_as_fields(services["worker"]["environment"])).endpoints == ENDPOINTS.split(
        ","
    )


def _as_fields(env: dict[str, Any]) -> dict[str, Any]:
    """A container's EAGLEGEN_* environment as Settings keywords (empty means unset)."""
    fields = {k.removeprefix("EAGLEGEN_").lower(): str(v) for k, v in env.items()}
    return {k: v for k, v in fields.items() if k in Settings.model_fields and v != ""}


def test_only_the_workers_get_the_api_key_and_only_flower_its_password(tmp_path: Path):
    services = resolved([MAIN], {**TEST_ENV, "EAGLEGEN_API_KEY": "sk-compose-test"}, tmp_path)
    for name, spec in services.items():
        env = spec.get("environment") or {}
        assert (env.get("EAGLEGEN_API_KEY") == "sk-compose-test") == (name == "worker"), name
        auth = env.get("FLOWER_BASIC_AUTH") == TEST_ENV["FLOWER_BASIC_AUTH"]
        assert auth == (name == "flower"), name


def test_workers_need_endpoints_set_no_silent_simulator_default(tmp_path: Path):
    env = {k: v for k, v in TEST_ENV.items() if k != "EAGLEGEN_ENDPOINTS"}
    result = compose_config([MAIN], env, tmp_path)
    assert result.returncode != 0 and "set EAGLEGEN_ENDPOINTS in .env" in result.stderr
    assert "simulator" not in str(load(MAIN)["services"]["worker"]["environment"]).split(":?")[0]


def test_env_example_runs_the_demo_as_it_is(tmp_path: Path):
    example = (ROOT / ".env.example").read_text()
    env = dict(line.split("=", 1) for line in example.splitlines() if line and line[0] != "#")
    assert (
        env["COMPOSE_PROFILES"] == "demo"
        and env["EAGLEGEN_ENDPOINTS"] == "http://simulator:8000/v1"
    )
    filled = {**env, "REDIS_PASSWORD": "pw", "FLOWER_BASIC_AUTH": "a:b"}
    assert "simulator" in resolved([MAIN], filled, tmp_path)
    # docker-compose v1 keeps a trailing comment or quotes as part of the value.
    for line in example.splitlines():
        value = line.lstrip("# ").partition("=")[2] if re.match(r"#? ?[A-Z_]+=", line) else ""
        assert " #" not in value and not value.startswith(("'", '"')), line


def test_workers_reach_a_vllm_on_their_own_host_by_name():
    for name in (MAIN, WORKER):
        assert (
            "host.docker.internal:host-gateway" in load(name)["services"]["worker"]["extra_hosts"]
        )


def test_the_collector_does_not_depend_on_the_callers_ids(tmp_path: Path):
    """`make up` and a plain `docker compose up --scale` give the collector the same config."""
    plain = resolved([MAIN], TEST_ENV, tmp_path)["collector"]
    ids = {**TEST_ENV, "EAGLEGEN_UID": "1000", "EAGLEGEN_GID": "1000"}
    with_ids = resolved([MAIN], ids, tmp_path)["collector"]
    for key in ("EAGLEGEN_UID", "EAGLEGEN_GID"):  # in .env they reach the container, unused
        del with_ids["environment"][key]
    assert with_ids == plain and plain["user"] == "0:0"
    assert "setpriv" in " ".join(plain["entrypoint"])  # it drops to ./out's owner at start


def test_base_images_are_build_args_defaulting_to_the_pinned_ones():
    dockerfile = (ROOT / "Dockerfile").read_text()
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.M)
    assert default and "FROM ${PYTHON_IMAGE}" in dockerfile
    for name in (MAIN, WORKER):
        for service, spec in load(name)["services"].items():
            if "build" in spec:
                args = spec["build"]["args"]
                assert args["PYTHON_IMAGE"] == f"${{PYTHON_IMAGE:-{default[1]}}}", (name, service)
    assert load(MAIN)["services"]["redis"]["image"] == "${REDIS_IMAGE:-redis:7.2.7-alpine}"


def test_the_collector_writes_to_a_mounted_directory():
    collector = load(MAIN)["services"]["collector"]
    out = collector["command"][collector["command"].index("--out") + 1]
    mounts = [with_defaults(v).split(":") for v in collector["volumes"]]
    assert any(out.startswith(target + "/") for _, target, *_ in mounts)


def test_the_producer_and_the_simulator_start_only_with_their_profiles():
    services = load(MAIN)["services"]
    assert services["producer"]["profiles"] == ["producer"]
    assert services["simulator"]["profiles"] == ["demo"]


def make_dry_run(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    dry = subprocess.run([make, "-n", *args], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    return dry.stdout


def test_make_up_scales_the_workers():
    assert "up -d --build --scale worker=4" in make_dry_run("up", "WORKERS=4", "DOCKER_COMPOSE=x")


@pytest.mark.parametrize("compose", ["docker compose", "docker-compose"])
def test_make_runs_compose_v2_or_v1_worker_host_too(compose: str):
    for target in ("up", "down", "worker-host", "enqueue"):
        assert f"{compose} -f docker-compose" in make_dry_run(target, f"DOCKER_COMPOSE={compose}")
