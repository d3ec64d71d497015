"""The suite writes only a Redis it started, unless EAGLEGEN_TEST_REDIS_URL names one: it
flushes databases, so a developer's Redis on the default port is never its to touch."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from common.store import connect


def _parent(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def test_the_suites_redis_is_a_server_the_session_started(redis_url: str, suite_env):
    if "EAGLEGEN_TEST_REDIS_URL" in suite_env:
        pytest.skip("EAGLEGEN_TEST_REDIS_URL names the suite's Redis")
    assert urlsplit(redis_url).port != 6379
    server = int(connect(redis_url).info("server")["process_id"])
    assert _parent(server) == os.getpid()
