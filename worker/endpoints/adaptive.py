"""Adaptive caps (``EAGLEGEN_ADAPTIVE=true``): each endpoint's cap follows its server's /metrics.

The goal is a server that runs full with its waiting queue near zero. vLLM's
``num_requests_waiting`` says when we send more than it runs at once, and ``num_requests_running``
at that moment is what it can run; the cap goes there, plus a small queue (``headroom``, 10% of
what runs): a request finishing frees its slot before the client that sent it has noticed and
sent the next one, and a few requests waiting keep the batch full through that hand-off (a
cap of exactly the server's capacity leaves some of its slots idle). While the
server runs everything we send and our slots are all taken, the cap grows: fast until the
server first queues, then one slot at a time every few reads, and fast again when such probes
keep succeeding (the server's capacity went up). KV-cache usage near full holds the cap.

The cap lives in Redis, so every worker obeys it; one process per endpoint drives it at a
time (a small lock), and the stored cap expires if no driver is left.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, replace

import httpx
import redis

from common.keys import EndpointKeys
from common.locks import HeldLock
from common.settings import Settings
from worker.endpoints.capacity import SlotTable
from worker.endpoints.vllm_metrics import family_values, metrics_url

log = logging.getLogger("eaglegen.adaptive")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, old name


@dataclass(frozen=True)
class ServerLoad:
    """What one /metrics read says (summed over models and engines)."""

    running: int
    waiting: int
    kv_usage: float | None = None  # 0..1


@dataclass(frozen=True)
class CapState:
    """The controller's memory between two reads."""

    cap: int
    ceiling: int | None = None  # what the server ran when it last queued; None: not known
    quiet: int = 0  # reads since the cap last changed


@dataclass(frozen=True)
class Limits:
    """Bounds and pace of the controller."""

    low: int = 1
    high: int = 1024
    growth: float = 1.5  # per read while the capacity is unknown
    probe_every: int = 3  # reads between one-slot probes above a known capacity
    kv_full: float = 0.98
    headroom: float = 0.1  # requests allowed to wait, as a share of those running

    def queue(self, running: int) -> int:
        """How many waiting requests are welcome when ``running`` run."""
        return math.ceil(running * self.headroom)


def next_cap(state: CapState, load: ServerLoad, inflight: int, limits: Limits) -> CapState:
    """The next cap, from the server's load and how many of our slots are taken."""
    ceiling = max(load.running, limits.low)
    if load.waiting > limits.queue(load.running):
        cap = _clamp(min(state.cap, load.running + limits.queue(load.running)), limits)
        return CapState(cap, ceiling, quiet=0)
    if load.waiting > 0:  # full, with the small queue we want
        return CapState(state.cap, ceiling, quiet=state.quiet + 1)
    quiet = replace(state, quiet=state.quiet + 1)
    # Growing only helps while we use every slot; a nearly full KV cache would preempt.
    if inflight < state.cap or (load.kv_usage or 0.0) >= limits.kv_full:
        return quiet
    known = None if state.ceiling is None else state.ceiling + limits.queue(state.ceiling)
    if known is None or state.cap < known:
        return _grow(state, known, limits)
    if quiet.quiet < limits.probe_every:
        return quiet
    if state.cap >= known + 2:  # two probes in a row ran without a queue
        return _grow(replace(state, ceiling=None), None, limits)
    return CapState(_clamp(state.cap + 1, limits), state.ceiling, quiet=0)


def _grow(state: CapState, known: int | None, limits: Limits) -> CapState:
    grown = max(state.cap + 1, int(state.cap * limits.growth))
    if known is not None:
        grown = min(grown, known)
    return CapState(_clamp(grown, limits), state.ceiling, quiet=0)


def _clamp(cap: int, limits: Limits) -> int:
    return max(limits.low, min(limits.high, cap))


def parse_metrics(text: str) -> ServerLoad:
    """Running, waiting and KV-cache usage from a Prometheus exposition of vLLM."""
    values = family_values(text, (RUNNING, WAITING, *KV_USAGE))
    if RUNNING not in values or WAITING not in values:
        raise ValueError(f"no {RUNNING} / {WAITING} in the metrics")
    kv = next((max(values[name]) for name in KV_USAGE if values.get(name)), None)
    return ServerLoad(int(sum(values[RUNNING])), int(sum(values[WAITING])), kv)


class AdaptiveDriver:
    """A thread that moves the caps of the endpoints whose lock this process holds."""

    def __init__(self, settings: Settings, client: redis.Redis, slots: SlotTable) -> None:
        self.settings = settings
        self.r = client
        self.slots = slots
        self.limits = Limits(
            high=settings.adaptive_max_inflight, headroom=settings.adaptive_headroom
        )
        self.states: dict[str, CapState] = {}
        self._locks: dict[str, HeldLock] = {}
        # A loaded server can take over a second to render /metrics; a read that times out
        # only leaves the cap as it is, so the timeout need not be tight.
        self._http = httpx.Client(timeout=5.0)
        # Long enough to survive a few missed reads, short enough that a stale cap goes away.
        self.cap_ttl = max(30.0, settings.adaptive_interval * 10)

    def run(self, stop: threading.Event) -> None:
        """Read and adjust every interval until ``stop``."""
        while not stop.wait(self.settings.adaptive_interval):
            try:
                self.step()
            except redis.RedisError as exc:
                log.warning("adaptive caps paused: %s", exc)
        self._http.close()

    def step(self) -> None:
        """One read of every endpoint we drive."""
        views = {view.endpoint: view for view in self.slots.snapshot()}
        for url, view in views.items():
            if not self._drive(url):
                self.states.pop(url, None)  # another process drives it; start afresh if ours again
                continue
            load = self._read(url)
            if load is not None:
                self._adjust(url, view.cap, view.inflight, load)

    def _drive(self, url: str) -> bool:
        if url not in self._locks:
            key = EndpointKeys(self.settings.key_prefix).adaptive_lock(url)
            self._locks[url] = HeldLock(self.r, key, self.settings.adaptive_interval * 3)
        return self._locks[url].hold()

    def _read(self, url: str) -> ServerLoad | None:
        try:
            response = self._http.get(metrics_url(url))
            response.raise_for_status()
            return parse_metrics(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("cannot read %s: %s; its cap stays", metrics_url(url), exc)
            return None

    def _adjust(self, url: str, cap: int, inflight: int, load: ServerLoad) -> None:
        state = self.states.get(url) or CapState(cap)
        new = next_cap(state, load, inflight, self.limits)
        self.states[url] = new
        self.slots.set_cap(url, new.cap, self.cap_ttl, wake=new.cap > state.cap)
        if new.cap != state.cap:
            log.info(
                "%s cap %d -> %d (running %d, waiting %d, ours %d)",
                url, state.cap, new.cap, load.running, load.waiting, inflight,
            )  # fmt: skip
