"""The image installs what pyproject.toml declares, nothing more, and runs as a plain user.

No docker engine runs here, so the Dockerfile is read, and its Python steps are run locally.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.harness import ROOT, child_env, free_port

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split()[0].upper(), line.partition(" ")[2]) for line in lines
            if line and not line.startswith("#")]  # fmt: skip


def of(kind: str) -> list[str]:
    return [args for name, args in instructions() if name == kind]


def test_the_base_image_is_a_pinned_slim_python():
    (base,) = of("FROM")
    assert base == "${PYTHON_IMAGE}"  # a build argument (docs/deployment.md, without Docker Hub)
    default = next(a for a in of("ARG") if a.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", default)


def test_the_dependency_layer_is_built_from_pyproject_alone():
    steps = instructions()
    first_copy = next(i for i, (name, _) in enumerate(steps) if name == "COPY")
    install = next(i for i, (name, args) in enumerate(steps) if name == "RUN" and "-r " in args)
    assert steps[first_copy][1] == "pyproject.toml ./"
    assert first_copy < install < first_copy + 2  # nothing else copied before the install


def test_the_image_installs_the_project_dependencies_and_nothing_else(tmp_path: Path):
    pip_calls = [cmd for run in of("RUN") for cmd in run.split("&&") if "pip install" in cmd]
    assert [c.split("pip install", 1)[1].split() for c in pip_calls] == [
        ["-r", "/tmp/requirements.txt"], ["--no-deps", "."],
    ]  # fmt: skip
    assert "torch" not in (ROOT / "Dockerfile").read_text().replace("no torch", "")
    assert requirements_the_image_writes(tmp_path) == PYPROJECT["project"]["dependencies"]


def requirements_the_image_writes(tmp: Path) -> list[str]:
    """Run the Dockerfile's own requirements step on a copy of pyproject.toml."""
    step = next(run for run in of("RUN") if "tomllib" in run).split("&&")[0]
    command, _, target = step.partition(">")
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-c"] and target.strip() == "/tmp/requirements.txt"
    (tmp / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    out = subprocess.run([sys.executable, "-c", argv[2]], cwd=tmp, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:-1]


def test_the_packages_copied_are_the_packages_pyproject_includes():
    included = {
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    sources = [args.split()[0] for args in of("COPY")]
    packages = {s for s in sources if (ROOT / s / "__init__.py").exists()}
    assert packages == included
    assert set(sources) - packages == {"pyproject.toml", "README.md", "data"}


def test_everything_copied_passes_the_dockerignore_and_nothing_secret_does():
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}  # fmt: skip
    assert {args.split()[0] for args in of("COPY")} <= allowed
    assert not allowed & {".env", "tls", "out", ".venv", ".eaglegen"}


def test_the_image_runs_as_an_unprivileged_user():
    steps = instructions()
    users = [i for i, (name, _) in enumerate(steps) if name == "USER"]
    runs = [i for i, (name, _) in enumerate(steps) if name == "RUN"]
    assert users and users[-1] > runs[-1] and steps[users[-1]][1] not in ("root", "0")


def test_the_health_check_fails_when_redis_does_not_answer():
    (check,) = of("HEALTHCHECK")
    argv = json.loads(check.split("CMD", 1)[1])  # the exec form is a JSON list
    assert argv[:2] == ["python", "-c"]
    env = child_env({"EAGLEGEN_REDIS_URL": f"redis://127.0.0.1:{free_port()}/10"})
    down = subprocess.run([sys.executable, "-c", argv[2]], cwd=ROOT, env=env, capture_output=True)
    assert down.returncode != 0


@pytest.mark.integration
def test_the_health_check_passes_when_redis_answers(redis_url: str):
    (check,) = of("HEALTHCHECK")
    code = json.loads(check.split("CMD", 1)[1])[2]
    env = child_env({"EAGLEGEN_REDIS_URL": redis_url})
    up = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True)
    assert up.returncode == 0, up.stderr
