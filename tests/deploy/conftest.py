"""The deploy tier's own Redis servers, stopped at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.redis_servers import RedisServers


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RedisServers]:
    started = RedisServers(tmp_path)
    yield started
    started.stop_all()
