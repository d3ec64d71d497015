"""Aborting orphaned generations on their server.

A worker paused past its lease (SIGSTOP, a VM freeze, a swap storm) or cut off from Redis but
not from the server keeps its stream open, and the server generates it to ``max_tokens`` for
no one while the worker that took the sample over generates it again. So every request
carries an id EagleGen chooses (``X-Request-Id``); the server's own id (vLLM:
``chatcmpl-<X-Request-Id>``, ``cmpl-<...>`` on /v1/completions, the ``id`` of every chunk) is
kept beside the lease (common/request_store.py), and whoever takes the lease over, the
reconciler when it reaps one, or the worker that gives a stream up itself, POSTs
``/inference/v1/abort_requests {"request_ids": [...]}`` to that server.

vLLM serves that route only with ``--enable-scale-out`` (403 without); whether an endpoint
aborts is learned from its first answer, remembered in Redis for every process, and shown by
``endpoints list`` and ``status``. An abort is best-effort: any failure is logged and the
generation it was meant to stop is, at worst, what it was before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import redis

from common import errors
from common.keys import EndpointKeys
from common.models import Checkpoint
from common.request_store import RequestRef
from common.settings import Settings
from common.store import WorkerStore
from worker.chat import transport
from worker.chat.checkpoints import TurnCheckpoints
from worker.endpoints.learned import LearnedPerEndpoint

log = logging.getLogger("eaglegen.worker")
ROUTE = "/inference/v1/abort_requests"
TIMEOUT_S = 5.0
HINT = "abort off: start vLLM with --enable-scale-out"
# Errors after which this side stops reading a stream the server may still be generating: a
# stall, the turn's time limit, a lost lease, a drain or shutdown, an answer not continued or
# not understood. (A dropped connection or a server error ends it on the server too.)
# What an abort or a probe may meet: the server, Redis, or a foreign value under the endpoint's
# entry in Redis (LearnedPerEndpoint raises on those). Best-effort: logged, never raised.
FAILED = (transport.TransportError, ValueError, KeyError, TypeError, redis.RedisError)
LET_GO = (errors.StallError, errors.TimeoutError_, errors.LeaseLost, errors.HandedBack,
          errors.BadResponse)  # fmt: skip


def abort_url(endpoint: str) -> str:
    """The abort route of an endpoint given as its OpenAI base (``http://host:port/v1``)."""
    base = endpoint.rstrip("/")
    return base.removesuffix("/v1") + ROUTE


def abort_ids(server_id: str) -> list[str]:
    """The ids to abort for a request whose chunks carry ``server_id``. vLLM's engine knows a
    chat request by its chunk id, but a /v1/completions one by the chunk id plus ``-<prompt
    index>`` (``cmpl-<X-Request-Id>-0``: one prompt); ids a server does not know are ignored."""
    return [server_id, f"{server_id}-0"] if server_id.startswith("cmpl-") else [server_id]


def saved_tokens(ref: RequestRef, checkpoint: Checkpoint | None) -> int:
    """At most how many tokens an abort of ``ref`` saves: what it had left of max_tokens
    after the tokens its turn's checkpoint shows (the server may have generated more)."""
    done = 0
    if checkpoint is not None and checkpoint.endpoint == ref.endpoint:
        done = max(checkpoint.tokens - ref.base, 0)
    return max(ref.max_tokens - done, 0)


class AbortSupport(LearnedPerEndpoint):
    """Whether each endpoint aborts requests by id: learned once, kept in Redis for all
    (``learn(endpoint, on, why=...)``)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        super().__init__(client, EndpointKeys(prefix).abort_support)

    @staticmethod
    def shown(client: redis.Redis, prefix: str) -> dict[str, str]:
        """Each endpoint's support as ``status`` and ``endpoints list`` show it: "on", or
        "abort off: start vLLM with --enable-scale-out (HTTP 403)"; absent: not tried yet."""
        raw = client.hgetall(EndpointKeys(prefix).abort_support)
        out = {}
        for endpoint, value in raw.items():
            try:
                entry = json.loads(str(value))
                out[str(endpoint)] = "on" if entry["on"] else f"{HINT} ({entry['why']})"
            except (ValueError, KeyError, TypeError):
                out[str(endpoint)] = f"unreadable entry: {str(value)[:40]!r}"
        return out


Counted = Callable[[str, int], None]  # (endpoint, tokens saved at most): one abort


class Aborter:
    """Sends aborts; counts them per run (``aborted``, ``abort_saved_tokens``)."""

    def __init__(
        self, client: redis.Redis, settings: Settings, counted: Counted | None = None
    ) -> None:
        self.support = AbortSupport(client, settings.key_prefix)
        self._headers = {
            "Authorization": f"Bearer {settings.api_key_value()}",
            "Content-Type": "application/json",
        }
        self._settings = settings
        self._counted = counted

    def orphan(
        self, store: WorkerStore, ref: RequestRef, checkpoint: Checkpoint | None, why: str
    ) -> bool:
        """Abort a request no one reads any more and count it in its run."""
        if not self.abort(ref, why):
            return False
        saved = saved_tokens(ref, checkpoint)
        try:
            store.incr("aborted")
            store.incr("abort_saved_tokens", saved)
        except redis.RedisError as exc:
            log.info("abort of %s not counted: %s", ref.server_id, exc)
        if self._counted is not None:
            self._counted(ref.endpoint, saved)
        return True

    def reaped(self, store: WorkerStore, ids: list[str], why: str = "lease taken over") -> int:
        """Abort the requests of samples whose lease the caller has just taken over (their
        holder no longer reads them; the caller has sent none yet); how many were aborted."""
        return self._orphans(store, lambda: store.pop_requests(ids), why)

    def reaped_from(
        self, store: WorkerStore, holders: dict[str, str], why: str = "lease reaped"
    ) -> int:
        """Abort the requests that reaped holders (sample id -> token) sent: fenced by the
        token, since between the reap and now another worker may have taken the lease and
        recorded its own live request; how many were aborted."""

        def pop() -> dict[str, RequestRef]:
            popped = {i: store.pop_own_request(i, token) for i, token in holders.items()}
            return {i: ref for i, ref in popped.items() if ref is not None}

        return self._orphans(store, pop, why)

    def _orphans(
        self, store: WorkerStore, pop: Callable[[], dict[str, RequestRef]], why: str
    ) -> int:
        done = 0
        try:
            for sample_id, ref in pop().items():
                done += self.orphan(store, ref, store.checkpoint(sample_id), why)
        except redis.RedisError as exc:
            log.info("requests of reaped leases not aborted: %s", exc)
        return done

    def abort(self, ref: RequestRef, why: str) -> bool:
        """Ask ``ref``'s server to stop it; whether it said yes (never raises)."""
        try:
            if self.support.get(ref.endpoint) is False:
                return False
            return self._post(ref, why)
        except FAILED as exc:
            log.info("abort of %s on %s failed: %s", ref.server_id, ref.endpoint, exc)
            return False

    def probe(self, endpoint: str) -> bool | None:
        """Learn whether ``endpoint`` aborts (an abort of no request), unless known already."""
        try:
            known = self.support.get(endpoint)
            return known if known is not None else self._send(endpoint, [])
        except FAILED as exc:
            log.info("abort support of %s not learned yet: %s", endpoint, exc)
            return None

    def _post(self, ref: RequestRef, why: str) -> bool:
        if not self._send(ref.endpoint, abort_ids(ref.server_id)):
            return False
        log.info("aborted %s on %s (%s)", ref.server_id, ref.endpoint, why)
        return True

    def _send(self, endpoint: str, ids: list[str]) -> bool:
        body = json.dumps({"request_ids": ids}).encode()
        # The project's one HTTP stack: one deadline over the whole call and a capped body (a
        # server answering with a huge or endless body costs no memory). Aborts are rare: a
        # connection each, closed after.
        http = transport.Connections(
            endpoint, self._headers, self._settings.connect_timeout, TIMEOUT_S, max_idle=1
        )
        try:
            status, _ = http.post(abort_url(endpoint), body, TIMEOUT_S, transport.ERROR_BODY)
        finally:
            http.close()
        if status in (403, 404, 405):
            # vLLM without --enable-scale-out (403), or a server without the route.
            self.support.learn(endpoint, False, why=f"HTTP {status}")
            log.warning("%s does not abort requests (HTTP %d); %s", endpoint, status, HINT)
            return False
        if status != 200:
            log.info("abort on %s: HTTP %d", endpoint, status)
            return False
        if self.support.get(endpoint) is None:
            self.support.learn(endpoint, True, why="abort_requests answered 200")
        return True


def _never(tokens: int) -> bool:
    return False


class TurnRequests:
    """The requests of one turn of one sample (a ``Progress`` for the client): each is kept
    beside the lease once its first chunk names it; checkpoints go on to ``checkpoints``."""

    def __init__(
        self, store: WorkerStore, sample_id: str, token: str, aborter: Aborter | None,
        checkpoints: TurnCheckpoints | None, max_tokens: int, base: int = 0,
    ) -> None:  # fmt: skip
        self.store, self.sample_id, self.token = store, sample_id, token
        self.aborter = aborter
        self.checkpoints = checkpoints
        self._due = checkpoints.due if checkpoints is not None else _never
        self.max_tokens, self.base = max_tokens, base
        self.sent = False  # a request of the turn was recorded (there may be one to abort)

    def due(self, tokens: int) -> bool:
        return self._due(tokens)

    def save(self, checkpoint: Checkpoint) -> None:
        if self.checkpoints is not None:
            self.checkpoints.save(checkpoint)

    def started(self, endpoint: str, server_id: str) -> None:
        """A request's first chunk arrived: keep its id for whoever takes the lease over."""
        left = max(self.max_tokens - self.base, 0)
        ref = RequestRef(endpoint=endpoint, server_id=server_id, token=self.token,
                         max_tokens=left, base=self.base)  # fmt: skip
        self.sent = True
        try:
            self.store.record_request(self.sample_id, ref)
        except redis.RedisError as exc:
            log.info("request %s of %s not recorded: %s", server_id, self.sample_id, exc)

    def gave_up(self, exc: errors.GenerationError) -> None:
        """A request of the turn failed: if this side let its stream go while the server may
        still be generating it, abort it (unless someone already did)."""
        if not self.sent or self.aborter is None or not isinstance(exc, LET_GO):
            return
        checkpoint, why = exc.checkpoint, exc.kind
        ref = self._pop()
        if ref is not None:
            self.aborter.orphan(self.store, ref, checkpoint, why)

    def _pop(self) -> RequestRef | None:
        try:
            return self.store.pop_own_request(self.sample_id, self.token)
        except redis.RedisError as exc:
            log.info("running request of %s not read: %s", self.sample_id, exc)
            return None
