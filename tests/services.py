"""What a test needs from outside (Redis, tools): skipped locally when missing, failed in CI."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest
import redis

from common.store import connect


def unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it in CI (``CI`` set), where every service must be present."""
    if os.environ.get("CI"):
        pytest.fail(f"needed in CI: {reason}")
    pytest.skip(reason)


def reachable_redis(url: str) -> str:
    """``url`` once Redis answers a PING there."""
    try:
        connect(url).ping()
    except redis.RedisError as exc:
        unavailable(f"no Redis at {url}: {exc}")
    return url


def require_tool(name: str) -> str:
    """The path of the program ``name``."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (see .ci/run)")
    return path
