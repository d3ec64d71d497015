"""Choosing an endpoint for each request."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from common.settings import Settings
from worker.client import ChatClient


class EndpointPool:
    """The configured endpoints; each request goes to the one with the fewest of our calls."""

    def __init__(self, settings: Settings) -> None:
        self.clients = [ChatClient(url, settings) for url in settings.endpoints]
        self._inflight = {c.endpoint: 0 for c in self.clients}
        self._lock = threading.Lock()

    @contextmanager
    def borrow(self) -> Iterator[ChatClient]:
        """The least busy endpoint's client, counted busy while the block runs."""
        with self._lock:
            low = min(self._inflight.values())
            client = random.choice([c for c in self.clients if self._inflight[c.endpoint] == low])
            self._inflight[client.endpoint] += 1
        try:
            yield client
        finally:
            with self._lock:
                self._inflight[client.endpoint] -= 1

    def close(self) -> None:
        """Close every client."""
        for client in self.clients:
            client.close()
