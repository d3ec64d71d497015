"""Cluster-wide in-flight caps per endpoint, held in Redis as slot leases.

Each endpoint has a sorted set of holder token -> lease expiry (ms, Redis clock). One Lua
script prunes expired leases, picks the eligible endpoint with the most free slots and adds
the token, so however many worker processes run on however many machines, an endpoint never
has more requests in flight than its cap; a holder that dies stops renewing and its slot
frees itself after ``slot_ttl``.

A thread waiting for a slot holds nothing: it is not in any set until the script admits it.
It sleeps until woken by our own releases at once and by other processes' releases through a
pub/sub message naming the endpoint, with a slow poll as the safety net. A thread waiting for
one endpoint in particular (``routing.py``: a later turn for its previous server) is
woken by that endpoint's releases before any other waiter.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from common import errors, lua
from common.keys import EndpointKeys
from worker.endpoints.routing import LOAD_FLOOR

log = logging.getLogger("eaglegen.capacity")
FREED = "1:"  # a release message: FREED + the endpoint (a bare "1" from older workers)


class CapacityUnavailable(errors.TransientError):
    """No slot could be had (Redis unreachable, or every endpoint full or out for too long)."""

    kind = "capacity"


@dataclass(frozen=True)
class Slot:
    """One request's lease on one endpoint's capacity."""

    endpoint: str
    token: str


@dataclass(frozen=True)
class Routed:
    """What a routed try got: a slot's endpoint, or none (and the first choice, to wait for)."""

    endpoint: str | None
    waiting_for: str | None = None


@dataclass(frozen=True)
class EndpointView:
    """One endpoint's capacity as Redis holds it now."""

    endpoint: str
    inflight: int
    cap: int
    adaptive: bool  # the cap was written by an adaptive driver (else it is configured)
    drained: bool


class SlotTable:
    """The Redis side: take, give back and renew slots; caps and the drained set."""

    def __init__(
        self, client: redis.Redis, prefix: str, caps: dict[str, int], ttl_s: float
    ) -> None:
        self.r = client
        self.prefix = prefix
        self.caps = dict(caps)  # configured cap per endpoint, in routing order
        self.ttl_ms = int(ttl_s * 1000)
        self.keys = EndpointKeys(prefix)
        self.channel = self.keys.freed
        self.drained_key = self.keys.drained
        self._acquire = client.register_script(lua.SLOT_ACQUIRE)
        self._route = client.register_script(lua.SLOT_ROUTE)
        self._release = client.register_script(lua.SLOT_RELEASE)
        self._renew = client.register_script(lua.SLOT_RENEW)
        self._restore = client.register_script(lua.SLOT_RESTORE)
        self._snapshot = client.register_script(lua.SLOT_SNAPSHOT)

    def slots_key(self, endpoint: str) -> str:
        """Sorted set of the endpoint's slot holders -> lease expiry."""
        return self.keys.slots(endpoint)

    def cap_key(self, endpoint: str) -> str:
        """The endpoint's cap when an adaptive driver sets it (expires if the driver stops)."""
        return self.keys.cap(endpoint)

    def try_acquire(self, token: str, eligible: Collection[str]) -> str | None:
        """A slot on the eligible endpoint with the most free capacity, or None if all full."""
        urls = list(self.caps)
        keys = [self.drained_key]
        args: list[str | int] = [token, self.ttl_ms, random.randrange(len(urls)), self.channel]
        for url in urls:
            keys += [self.slots_key(url), self.cap_key(url)]
            args += [url, self.caps[url], int(url in eligible)]
        index = int(self._acquire(keys=keys, args=args))
        return urls[index - 1] if index else None

    def try_route(
        self, token: str, ranking: Sequence[str], eligible: Collection[str], load_bound: float,
        wait: bool, floor: float = LOAD_FLOOR,
    ) -> Routed:  # fmt: skip
        """A slot by the routing policy (``routing.py``) over ``ranking``, in one script.

        ``wait``: return ``waiting_for`` rather than fall back when the first choice is full.
        """
        keys = [self.drained_key]
        args: list[str | int | float] = [token, self.ttl_ms, load_bound, int(wait), floor]
        for url in ranking:
            keys += [self.slots_key(url), self.cap_key(url)]
            args += [url, self.caps[url], int(url in eligible)]
        index = int(self._route(keys=keys, args=args))
        if index < 0:
            return Routed(None, waiting_for=ranking[0])
        return Routed(ranking[index - 1] if index else None)

    def release(self, slot: Slot) -> None:
        """Give a slot back and wake waiters everywhere (those for its endpoint first)."""
        args = [slot.token, self.channel, FREED + slot.endpoint]
        self._release(keys=[self.slots_key(slot.endpoint)], args=args)

    def renew(self, slots: Collection[Slot]) -> list[Slot]:
        """Extend the leases still in Redis; returns the slots that were not there."""
        missing: list[Slot] = []
        for url, tokens in _by_endpoint(slots).items():
            gone = self._renew(keys=[self.slots_key(url)], args=[self.ttl_ms, *tokens])
            missing += [Slot(url, str(token)) for token in gone]
        return missing

    def restore(self, slots: Collection[Slot]) -> int:
        """Put back leases that expired while their request still runs; returns how many."""
        restored = 0
        for url, tokens in _by_endpoint(slots).items():
            restored += int(self._restore(keys=[self.slots_key(url)], args=[self.ttl_ms, *tokens]))
        return restored

    def snapshot(self) -> list[EndpointView]:
        """Every configured endpoint's in-flight count, cap and state."""
        urls = list(self.caps)
        keys = [key for url in urls for key in (self.slots_key(url), self.cap_key(url))]
        flat = self._snapshot(keys=keys, args=[self.caps[url] for url in urls])
        drained = self.drained()
        return [
            EndpointView(url, int(flat[3 * i]), int(flat[3 * i + 1]), flat[3 * i + 2] == 1,
                         url in drained)
            for i, url in enumerate(urls)
        ]  # fmt: skip

    def set_cap(self, endpoint: str, cap: int, ttl_s: float, wake: bool = False) -> None:
        """Store an endpoint's cap for every worker; ``wake`` when it went up."""
        self.r.set(self.cap_key(endpoint), cap, px=int(ttl_s * 1000))
        if wake:
            self.r.publish(self.channel, "cap")

    def report_health(self, endpoint: str, state: str, message: str = "") -> None:
        """Publish what this process last saw of an endpoint: up, down or refusing, and why."""
        seen = {"state": state, "message": message[:300], "at": time.time(),
                "by": socket.gethostname()}  # fmt: skip
        self.r.hset(self.keys.health, endpoint, json.dumps(seen))

    def health(self) -> dict[str, dict[str, Any]]:
        """Every endpoint's last reported state."""
        return {str(k): json.loads(v) for k, v in self.r.hgetall(self.keys.health).items()}

    def drained(self) -> set[str]:
        """Endpoints that take no new requests."""
        return {str(url) for url in self.r.smembers(self.drained_key)}

    def drain(self, endpoint: str) -> bool:
        """Stop sending new requests to an endpoint (running ones finish)."""
        drained = bool(self.r.sadd(self.drained_key, endpoint))
        self.r.publish(self.channel, "drain")  # requests waiting for it go elsewhere now
        return drained

    def undrain(self, endpoint: str) -> bool:
        """Send requests to a drained endpoint again."""
        back = bool(self.r.srem(self.drained_key, endpoint))
        self.r.publish(self.channel, "undrain")
        return back


def _by_endpoint(slots: Collection[Slot]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for slot in slots:
        grouped.setdefault(slot.endpoint, []).append(slot.token)
    return grouped


class FreeSignal:
    """Wakes threads waiting for a slot when one may have freed up.

    Each waiter sleeps on an event of its own, in the line of the endpoint it waits for (None:
    any), placed by the ticket it drew when it began waiting, so it keeps its place however
    often it wakes and fails. A release on an endpoint wakes whoever came first of those who
    can use it (its own waiters and those for any); when none waits, the first waiter for
    another endpoint (a slot nobody waits for is better used elsewhere than left idle). A woken
    waiter that finds nothing just waits again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[str | None, list[tuple[int, int, threading.Event]]] = {}
        self._generation = 0
        self._tickets = itertools.count(1)

    def ticket(self) -> int:
        """A waiter's place in line, kept across its retries (lower is served first)."""
        return next(self._tickets)

    def generation(self) -> int:
        """A number that changes on every notification (read it before trying for a slot)."""
        with self._lock:
            return self._generation

    def wait(self, seen: int, timeout: float, endpoint: str | None = None, ticket: int = 0) -> None:
        """Sleep, as a waiter for ``endpoint`` (None: any), unless a notification came since
        ``seen`` was read (a slot freed anywhere may now be one this waiter can take)."""
        with self._lock:
            if self._generation != seen:
                return
            entry = (ticket, next(self._tickets), threading.Event())
            line = self._lines.setdefault(endpoint, [])
            bisect.insort(line, entry)
        if not entry[2].wait(timeout):
            with self._lock, contextlib.suppress(ValueError):  # woken as it timed out
                line.remove(entry)

    def notify(self, waiters: int = 1, endpoint: str | None = None) -> None:
        """Wake some waiters who can use a slot freed on ``endpoint`` (they try again; a loser
        just waits again)."""
        with self._lock:
            self._generation += 1
            for _ in range(waiters):
                if not self._wake_first(endpoint):
                    return

    def notify_all(self) -> None:
        """Wake every waiter (an endpoint came back, a cap went up)."""
        with self._lock:
            self._generation += 1
            for line in self._lines.values():
                for _, _, event in line:
                    event.set()
                line.clear()

    def _wake_first(self, endpoint: str | None) -> bool:
        keys = [endpoint, None] if endpoint is not None else [None]
        heads = [(line[0], key) for key in keys if (line := self._lines.get(key))]
        if not heads:
            return False
        (_, _, event), key = min(heads, key=lambda head: head[0][:2])
        self._lines[key].pop(0)
        event.set()
        return True

    def listen(self, client: redis.Redis, channel: str, stop: threading.Event) -> None:
        """Relay other processes' releases until ``stop``; reconnects after Redis errors."""
        while not stop.is_set():
            try:
                self._relay(client, channel, stop)
            except redis.RedisError as exc:
                log.warning("slot wake-ups lost (%s); waiters fall back to polling", exc)
                stop.wait(1.0)

    def _relay(self, client: redis.Redis, channel: str, stop: threading.Event) -> None:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(channel)
            while not stop.is_set():
                message = pubsub.get_message(timeout=0.5)
                if message is None:
                    continue
                data = str(message.get("data"))
                if data == "1":
                    self.notify()
                elif data.startswith(FREED):
                    self.notify(endpoint=data.removeprefix(FREED))
                else:
                    self.notify_all()
        finally:
            pubsub.close()
