"""The vLLM tier's fixtures: the main server and a pipeline timed for a real server (Redis is
the suite's: its own, unless EAGLEGEN_TEST_REDIS_URL names one).

Where the server was never installed the tier skips with the set-up's reason; in CI (``CI``
set) that is a failure, as is a server that is installed but does not come up.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import unavailable
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
