"""The ids EagleGen gives its generation requests (``X-Request-Id``), so that a server's own
id for a request (vLLM: ``chatcmpl-<X-Request-Id>``) can name it in an abort later."""

from __future__ import annotations

import uuid


def new_request_id() -> str:
    """The ``X-Request-Id`` of one generation request: unique, ASCII, header-safe."""
    return f"eaglegen-{uuid.uuid4().hex}"
