"""The vLLM tier's fixtures: the main server, its Redis (DB 11 unless EAGLEGEN_TEST_REDIS_URL
says otherwise: other tiers use other DBs), and a pipeline timed for a real server.

Where the server was never installed the tier skips with the set-up's reason; in CI (``CI``
set) that is a failure, as is a server that is installed but does not come up.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import reachable_redis, unavailable
from tests.stack import Stack
from tests.vllm.server import (
    Server,
    not_installed_reason,
    report,
    reported,
    start_server,
    stop_server,
)


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    reason = not_installed_reason()
    if reason is not None:
        unavailable(f"the vLLM tier: {reason}")


@pytest.fixture(scope="session")
def vllm_server(vllm_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tier's main server: default scheduling limits."""
    server = start_server(tmp_path_factory.mktemp("vllm"))
    report(f"vLLM server ready in {server.started_s} s")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def redis_url(suite_env: dict[str, str]) -> str:
    return reachable_redis(suite_env.get("EAGLEGEN_TEST_REDIS_URL", "redis://127.0.0.1:6379/11"))


@pytest.fixture
def stack(stack: Stack) -> Stack:
    """The suite's stack, with timeouts for a real server on a busy machine."""
    stack.env["EAGLEGEN_STALL_TIMEOUT"] = "120"  # a 2-core machine may queue a stream that long
    stack.env["EAGLEGEN_LEASE_TTL"] = "30"
    return stack


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = reported()
    if lines:
        terminalreporter.section("vLLM tier measurements")
        for line in lines:
            terminalreporter.write_line(line)
