"""Choosing an endpoint for each request, under cluster-wide caps.

A request waits, holding nothing, for a slot (``capacity.py``): by default on the
endpoint its routing hint prefers (``routing.py``: its previous turn's server, or one
drawn from its leading prefix) while that one's load is within bounds, else on the endpoint
with the most free capacity cluster-wide; then the optional rate limits let it go. How it ends is
reported back: an endpoint failing repeatedly is taken out for a cool-down, probed in the
background and brought back. Drained endpoints (``eaglegen endpoints drain``) get no new
requests; the ones they run finish.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import redis

from common import errors
from common.keys import EndpointKeys
from common.logs import secrets_of
from common.models import Checkpoint, GenParams, TurnResult
from common.redact import redact
from common.settings import Settings
from worker.chat.client import ChatClient, Check, Messages, Progress
from worker.endpoints.capacity import CapacityUnavailable, FreeSignal, Routed, Slot, SlotTable
from worker.endpoints.health import EndpointHealth, counts_against
from worker.endpoints.learned import LearnedPerEndpoint
from worker.endpoints.ratelimit import RateLimiter
from worker.endpoints.routing import Route, RouteHint, plan, rendezvous

log = logging.getLogger("eaglegen.endpoints")

FIRST_PAUSE = 0.05  # seconds; a waiter's poll grows from here when no wake-up comes
MAX_PAUSE = 1.0
PROBE_TICK = 0.5
ABORT_GRACE = 0.5  # seconds a server takes, at most, to drop a request whose client left
# Refused before the server ran anything: the slot can go back at once.
NOT_ADMITTED = (errors.ConnectError, errors.RateLimited, errors.ServerError, errors.PermanentError)


class EndpointPool:
    """The configured endpoints, their shared caps and their health.

    Its background work (``check_all``, ``renew_loop``, ``probe_loop``, ``listen``) runs on
    threads the composition root (``worker.app``) starts; each loop ends at ``close()``.
    """

    def __init__(
        self, settings: Settings, client: redis.Redis, table: SlotTable,
        clients: dict[str, ChatClient], limiter: RateLimiter | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.r = client
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.limiter = limiter
        self.clients = clients
        self.table = table
        self.health = {url: _health(settings) for url in clients}
        # Whether each endpoint continues checkpoints, as some worker learned it by trying: a
        # routing preference for checkpoints only (each continuation is still proven), so that
        # a process started later does not discard one to learn it again. Best-effort.
        self.continuation = LearnedPerEndpoint(
            client, EndpointKeys(settings.key_prefix).continuation
        )
        self.signal = FreeSignal()
        self._held: set[Slot] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._secrets = secrets_of(settings)

    @contextmanager
    def borrow(
        self, check: Check | None = None, hint: RouteHint | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Iterator[ChatClient]:  # fmt: skip
        """A slot on an endpoint, and its client, for one request.

        ``check`` runs while waiting and may raise to give up (the sample's lease was lost).
        ``hint`` routes by prefix cache (``EAGLEGEN_ROUTING=cache``); without it, or with
        ``least-loaded``, the endpoint with the most free capacity. ``avoid``: endpoints
        refused for the request's run (they serve another model).
        """
        slot = self._acquire(check, hint, avoid)
        try:
            yield self.clients[slot.endpoint]
        except BaseException as exc:
            if isinstance(exc, errors.GenerationError):
                self._record(slot.endpoint, exc)
            self._release_after_abort(slot, exc)
            raise
        self._record(slot.endpoint, None)
        self._release(slot)

    def held(self) -> int:
        """Slots this process holds now."""
        with self._lock:
            return len(self._held)

    @property
    def stopped(self) -> threading.Event:
        """Set by ``close()``: the background loops end on it."""
        return self._stop

    def close(self) -> None:
        """Stop the loops, give back held slots, close every client."""
        self._stop.set()
        self.signal.notify_all()
        if self.limiter is not None:
            self.limiter.close()
        with self._lock:
            held = list(self._held)
        for slot in held:
            self._release(slot)
        for client in self.clients.values():
            client.close()

    # -- taking and giving back slots ----------------------------------------------------
    def _acquire(
        self, check: Check | None, hint: RouteHint | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Slot:  # fmt: skip
        if hint is not None and hint.resume_from is not None:
            hint, avoid = self._resume_route(hint, avoid)
        slot = self._slot(check, self._route(hint), avoid)
        if self.limiter is not None:
            # Paid once a slot is ours, not before: requests waiting for capacity must not
            # pre-pay the rate and then leave together in a burst when an endpoint frees up.
            try:
                self.limiter.wait_turn(check)
            except BaseException:
                self._release(slot)
                raise
        return slot

    def _resume_route(
        self, hint: RouteHint, avoid: frozenset[str]
    ) -> tuple[RouteHint, frozenset[str]]:
        """A checkpoint continues on its own server unless that one is known not to continue
        it; then on one proven to, else on one not known not to. While one such can take it,
        the servers known not to are avoided (waiting for a slot costs less than generating
        the checkpoint again); with none, it goes anywhere and starts again."""
        continues = self._continues()
        unable = frozenset(url for url, on in continues.items() if on is False)
        order = rendezvous(hint.key, {url: self.table.caps.get(url, 1) for url in self.clients})
        able = [url for url in order if url not in unable | avoid]
        if not able:
            return hint, avoid
        proven = [url for url in able if continues[url]]
        prefer = hint.resume_from if hint.resume_from in able else (proven or able)[0]
        return replace(hint, previous=prefer), avoid | unable

    def _continues(self) -> dict[str, bool | None]:
        """Per endpoint, what this process learned of it, else what another one did."""
        found = {url: client.continues() for url, client in self.clients.items()}
        shared: dict[str, bool | None] = {}
        with contextlib.suppress(redis.RedisError, ValueError, KeyError, TypeError):
            shared = self.continuation.get_many(url for url, on in found.items() if on is None)
        return {url: shared.get(url) if on is None else on for url, on in found.items()}

    def _route(self, hint: RouteHint | None) -> Route | None:
        if hint is None or self.settings.routing != "cache":
            return None
        return plan(hint, self.table.caps)

    def _slot(
        self, check: Check | None, route: Route | None = None, avoid: frozenset[str] = frozenset()
    ) -> Slot:
        token = f"{self.owner}:{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + self.settings.max_request_time
        # A later turn may wait this long for its previous server, if that one is full.
        patience = time.monotonic() + (self.settings.affinity_wait if route and route.sticky else 0)
        pause = FIRST_PAUSE
        ticket = self.signal.ticket()  # its place in line while it waits
        while True:
            patient = time.monotonic() < patience
            seen = self.signal.generation()
            routed = self._try(token, route, patient, avoid)
            if routed.endpoint is not None:
                _log_move(route, routed.endpoint, patient)
                return self._hold(Slot(routed.endpoint, token))
            deadline = self._keep_waiting(check, deadline)
            if routed.waiting_for is not None:  # woken by releases there, or at the end
                timeout = max(patience - time.monotonic(), 0.0)
                self.signal.wait(seen, timeout, routed.waiting_for, ticket)
            else:
                self.signal.wait(seen, pause, ticket=ticket)
            pause = min(pause * 2, MAX_PAUSE)

    def _keep_waiting(self, check: Check | None, deadline: float) -> float:
        """The deadline to wait for a slot until; raises to give up."""
        if check is not None:
            check()
        if self._all_out():
            # Every server is down (restarting, or wrongly configured): wait for a probe to
            # bring one back rather than fail samples that only need it to come up.
            deadline = time.monotonic() + self.settings.max_request_time
        if time.monotonic() > deadline or self._stop.is_set():
            raise CapacityUnavailable("no endpoint had a free slot within max_request_time")
        return deadline

    def _all_out(self) -> bool:
        with self._lock:
            return all(health.out for health in self.health.values())

    def _try(
        self, token: str, route: Route | None, patient: bool, avoid: frozenset[str] = frozenset()
    ) -> Routed:
        with self._lock:
            eligible = [
                url for url, health in self.health.items() if not health.out and url not in avoid
            ]
        if not eligible:
            return Routed(None)
        try:
            if route is None:
                return Routed(self.table.try_acquire(token, eligible))
            bound = self.settings.affinity_load_bound
            return self.table.try_route(token, route.ranking, eligible, bound, patient)
        except redis.RedisError as exc:
            raise CapacityUnavailable(f"cannot take an endpoint slot: {exc}") from exc

    def _hold(self, slot: Slot) -> Slot:
        with self._lock:
            self._held.add(slot)
        return slot

    def _release(self, slot: Slot) -> None:
        with self._lock:
            if slot not in self._held:
                return
            self._held.discard(slot)
        try:
            self.table.release(slot)
        except redis.RedisError as exc:
            log.warning("slot on %s not given back (%s); it expires by itself", slot.endpoint, exc)
        self.signal.notify(endpoint=slot.endpoint)

    def _release_after_abort(self, slot: Slot, exc: BaseException) -> None:
        # A stream we abandon keeps running on the server until it notices the closed
        # connection; its slot stays taken that long, or the next request would overshoot.
        if isinstance(exc, NOT_ADMITTED):
            self._release(slot)
        else:
            timer = threading.Timer(ABORT_GRACE, self._release, [slot])
            timer.daemon = True
            timer.start()

    # -- endpoint health -----------------------------------------------------------------
    def _record(self, endpoint: str, exc: errors.GenerationError | None) -> None:
        learned = self.clients[endpoint].continues()
        if learned is not None and self.continuation.known(endpoint) != learned:
            # A continuation tried on this request: the other processes route by it.
            with contextlib.suppress(redis.RedisError):
                self.continuation.learn(endpoint, learned)
        with self._lock:
            health = self.health[endpoint]
            if exc is None:
                changed = health.success()
            elif counts_against(exc):
                changed = health.failure(time.monotonic())
            else:
                return
        if changed and exc is None:
            log.warning("endpoint %s is back", endpoint)
            self._report(endpoint, None)
            self.signal.notify_all()
        elif changed:
            log.warning("endpoint %s taken out after %d failures in a row: %s",
                        endpoint, health.failures, exc)  # fmt: skip
            self._report(endpoint, exc)
            self.signal.notify_all()  # requests waiting for it go elsewhere now

    def check_all(self) -> None:
        """At start: ask every endpoint for its models, each on its own thread (a slow one
        delays no other); say which cannot be reached, and why."""
        threads = [_spawn(partial(self._check, url), "endpoint-check")
                   for url in self.clients]  # fmt: skip
        for thread in threads:
            thread.join()

    def _check(self, url: str) -> None:
        try:
            self.clients[url].probe()
            model = self.clients[url].model()
        except errors.GenerationError as exc:
            self._found_down(url, exc)
            return
        chosen = "EAGLEGEN_MODEL" if self.settings.model else "the first of its /v1/models"
        log.info("endpoint %s answers; serving model %s (%s)", url, model, chosen)
        self._report(url, None)

    def _found_down(self, url: str, exc: errors.GenerationError) -> None:
        if not counts_against(exc):  # it answers, but refuses (a wrong key or model name)
            log.warning("endpoint %s answers but refuses: %s", url, exc)
            self._report(url, exc, state="refusing")
            return
        with self._lock:
            self.health[url].mark_down(time.monotonic())
        log.warning("endpoint %s cannot be reached (%s); requests wait for it to answer, "
                    "probed every %.0f s or more", url, exc,
                    self.settings.endpoint_cooldown)  # fmt: skip
        self._report(url, exc)

    def _report(self, url: str, exc: errors.GenerationError | None, state: str = "") -> None:
        try:
            state = state or ("up" if exc is None else "down")
            # Shown by status; a server may quote the API key back in its error.
            message = "" if exc is None else redact(str(exc), self._secrets)
            self.table.report_health(url, state, message)
        except redis.RedisError as err:
            log.warning("endpoint state not published: %s", err)

    def probe_loop(self) -> None:
        """Probe endpoints that are out once their cool-down is over, until ``close()``; each
        probe on a thread of its own: one slow server never delays another's probe."""
        probing: dict[str, threading.Thread] = {}
        while not self._stop.wait(PROBE_TICK):
            now = time.monotonic()
            with self._lock:
                due = [url for url, health in self.health.items() if health.probe_due(now)]
            for url in due:
                if url not in probing or not probing[url].is_alive():
                    probing[url] = _spawn(partial(self._probe, url), "probe")

    def _probe(self, url: str) -> None:
        try:
            self.clients[url].probe()
        except errors.GenerationError as exc:
            with self._lock:
                self.health[url].probe_failed(time.monotonic())
                until = self.health[url].out_until or 0.0
            log.warning("endpoint %s still down (%s); next probe in %.0f s",
                        url, exc, until - time.monotonic())  # fmt: skip
            self._report(url, exc)
            return
        self._record(url, None)

    # -- background (threads started by worker.app) ------------------------------------
    def renew_loop(self) -> None:
        """Renew the held slots' leases every third of their TTL, until ``close()``."""
        # By time, not by stream progress: a request the server queues for minutes is still ours.
        while not self._stop.wait(self.settings.slot_ttl / 3):
            try:
                self.renew_slots()
            except redis.RedisError as exc:
                log.warning("slot renewal failed: %s", exc)

    def renew_slots(self) -> int:
        """Extend the leases of held slots; returns how many had expired and were put back."""
        with self._lock:
            held = list(self._held)
        missing = self.table.renew(held)
        if not missing:
            return 0
        # Under the lock: a release discards its slot under it before deleting the lease, so
        # a slot still held here is deleted after we put it back, never before.
        with self._lock:
            running = [slot for slot in missing if slot in self._held]
            restored = self.table.restore(running) if running else 0
        if restored:
            log.warning("%d slot leases had expired before renewal; counted again", restored)
        return restored

    def listen(self) -> None:
        """Hear other processes' slot releases (wake-ups for waiters), until ``close()``."""
        self.signal.listen(self.r, self.table.channel, self._stop)


class _MeteredClient(ChatClient):
    """A client that reserves each turn's tokens under the tokens/min limit, then settles."""

    def __init__(self, endpoint: str, settings: Settings, limiter: RateLimiter) -> None:
        super().__init__(endpoint, settings)
        self._limiter = limiter

    def complete(
        self, messages: Messages, params: GenParams, check: Check | None = None, *,
        turn: int = 0, resume: Checkpoint | None = None, progress: Progress | None = None,
        fields: dict[str, Any] | None = None,
    ) -> TurnResult:  # fmt: skip
        """Generate one turn within the budget; an aborted stream pays what the server spent."""
        prompt = estimate_prompt_tokens(messages)
        if fields:  # the tools' definitions are prompt tokens too
            prompt += len(str(fields)) // 4
        reserved = self._limiter.reserve_tokens(prompt + params.max_tokens, check)
        used = reserved  # unknown (an abort of ours): the reservation stands
        try:
            result = super().complete(
                messages, params, check, turn=turn, resume=resume, progress=progress,
                fields=fields,
            )  # fmt: skip
            used = result.usage.prompt_tokens + result.usage.completion_tokens
            return result
        except errors.GenerationError as exc:
            used = prompt + exc.tokens_streamed  # the server spent them: the budget did too
            raise
        finally:
            self._settle(reserved, used)

    def _settle(self, reserved: int, used: int) -> None:
        try:
            self._limiter.settle_tokens(reserved, used)
        except redis.RedisError as exc:  # losing one settlement is the lesser harm
            log.warning("tokens/min not settled: %s", exc)


def _log_move(route: Route | None, endpoint: str, patient: bool) -> None:
    if route and route.sticky and endpoint != route.ranking[0]:
        why = "out or over its share of the load" if patient else "waited out"
        log.debug("a later turn for %s went to %s (%s)", route.ranking[0], endpoint, why)


def estimate_prompt_tokens(messages: Messages) -> int:
    """About four characters per token plus a few per message, as hosted APIs estimate."""
    return sum(len(str(m.get("content") or "")) // 4 + 4 for m in messages)


def rate_limiter(settings: Settings, client: redis.Redis) -> RateLimiter | None:
    """The cluster-wide rate limits, if any is configured."""
    if settings.rpm is None and settings.tpm is None:
        return None
    return RateLimiter(client, settings.key_prefix, settings.rpm, settings.tpm)


def chat_client(url: str, settings: Settings, limiter: RateLimiter | None) -> ChatClient:
    """The client of one endpoint, metered when a tokens/min limit is set."""
    if limiter is not None and limiter.tpm is not None:
        return _MeteredClient(url, settings, limiter)
    return ChatClient(url, settings)


def _health(settings: Settings) -> EndpointHealth:
    # Probes are one GET each: a dead server is still asked at least every six cool-downs.
    cooldown = settings.endpoint_cooldown
    return EndpointHealth(settings.endpoint_failures, cooldown, max_cooldown=cooldown * 6)


def _spawn(target: Callable[[], None], name: str) -> threading.Thread:
    """A short-lived thread (one probe of one endpoint)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
