"""The fixtures every tier shares: the suite's Redis, child processes, one pipeline per test.

Redis is the suite's own: a redis-server it starts on a free port (and stops), unless
EAGLEGEN_TEST_REDIS_URL names one, whose database is flushed before and after each test that
asks for ``rdb`` (so name a database nothing else uses). No redis-server, or an unreachable
named one, skips the tests locally but fails them in CI. No test sees the developer's
``EAGLEGEN_*`` variables or ``.env`` file: the suite reads its own settings once at start, then
every test runs without them, in an empty folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from common.store import connect
from tests.harness import Procs, own_redis
from tests.services import reachable_redis, require_tool
from tests.stack import Stack

SUITE_ENV = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    # Read before any test hides them (see ``no_eaglegen_settings``).
    config.stash[SUITE_ENV] = {k: v for k, v in os.environ.items() if k.startswith("EAGLEGEN_")}


@pytest.fixture(scope="session")
def suite_env(pytestconfig: pytest.Config) -> dict[str, str]:
    """The ``EAGLEGEN_*`` variables the suite was started with (its own settings among them)."""
    return pytestconfig.stash[SUITE_ENV]


@pytest.fixture(scope="session")
def empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cwd")


@pytest.fixture(autouse=True)
def no_eaglegen_settings(monkeypatch: pytest.MonkeyPatch, empty_dir: Path) -> None:
    """Every test starts from the defaults, whatever the developer's shell or ``.env`` holds."""
    for name in [k for k in os.environ if k.startswith("EAGLEGEN_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(empty_dir)  # ``Settings()`` reads ``.env`` from the working directory


@pytest.fixture(scope="session")
def redis_url(suite_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    named = suite_env.get("EAGLEGEN_TEST_REDIS_URL")
    if named:
        yield reachable_redis(named)
        return
    require_tool("redis-server")
    with own_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = connect(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    """The test's child processes, stopped at teardown; their logs printed if the test failed."""
    started = Procs(tmp_path)
    yield started
    started.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(started.logs())


@pytest.fixture
def stack(procs: Procs, redis_url: str, rdb: redis.Redis, tmp_path: Path) -> Stack:
    return Stack(procs, redis_url, tmp_path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.path):
            item.add_marker(pytest.mark.integration)
