"""Prefix-cache-aware routing: the order in which a request prefers the endpoints.

Turn k+1 of a conversation begins with turn k's prompt and answer, which sit in the prefix
cache of the server that produced turn k; any other server computes the whole prefix again.
So a later turn (and a sample resumed after a retry) prefers the endpoint of its previous turn,
and a first turn prefers endpoints in an order drawn from its leading prefix (weighted
rendezvous hashing), so that samples sharing a long system prompt meet on the same servers.

This module is pure: it orders the endpoints. The slot is taken in Redis, atomically, by the
``SLOT_ROUTE`` script (``common/lua/``), which walks that order as ``choose`` does here: the
first eligible endpoint whose load stays within ``bound`` x its share of the cluster's load
(so one popular prompt cannot pile onto one server) gets the request if it has a free slot,
else the endpoint with the most free slots does: no slot stays idle while a request waits.
With every slot taken, a later turn waits for its previous server (for a bounded time).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from common.models import GenParams, Sample, TurnResult

# The bound compares a server's load with the cluster's mean load, counted as at least this
# share of its capacity: on a quiet cluster (a run's tail) a few conversations more on one
# server cost nothing, while moving them would recompute their whole prefixes.
LOAD_FLOOR = 0.25
# The leading characters that key a first turn: long enough to tell apart system prompts that
# share a beginning, short enough that prompts sharing one long system prompt share the key.
PREFIX_CHARS = 2048


@dataclass(frozen=True)
class RouteHint:
    """What routing knows of one request: its leading prefix and its previous turn's server."""

    key: str  # hash of the conversation's leading prefix
    previous: str | None = None  # endpoint that answered the previous turn, if any
    resume_from: str | None = None  # the server of the checkpoint this request continues

    def after(self, endpoint: str) -> RouteHint:
        """The hint of the conversation's next turn, once ``endpoint`` answered this one."""
        return replace(self, previous=endpoint or None, resume_from=None)

    def resuming(self, endpoint: str) -> RouteHint:
        """The hint of a turn continuing a checkpoint made on ``endpoint`` (its prompt and
        partial answer are in that server's cache)."""
        return replace(self, previous=endpoint or None, resume_from=endpoint or None)


@dataclass(frozen=True)
class Route:
    """Every endpoint, most preferred first."""

    ranking: list[str]
    sticky: bool  # ranking[0] holds the conversation so far: worth a bounded wait


@dataclass(frozen=True)
class Load:
    """One endpoint's state as the routing script sees it."""

    inflight: int
    cap: int
    eligible: bool = True  # not drained, not taken out after failures


@dataclass(frozen=True)
class Choice:
    """Where a request goes: an endpoint, or nowhere yet (``wait``: for the first choice)."""

    endpoint: str | None
    wait: bool = False


def prefix_key(system: str | None, first_user: str) -> str:
    """A short stable key of a conversation's leading prompt text."""
    text = f"{system or ''}\x00{first_user}"[:PREFIX_CHARS]
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def hint_for(sample: Sample, params: GenParams, answered: Sequence[TurnResult]) -> RouteHint:
    """The hint of a sample's next turn; ``answered`` is its saved progress (the affinity)."""
    first = params.turns_of(sample.user_turns)[0]
    key = prefix_key(params.system_for(sample.system), first)
    return RouteHint(key, (answered[-1].endpoint or None) if answered else None)


def rendezvous(key: str, weights: Mapping[str, int]) -> list[str]:
    """The endpoints in ``key``'s order of preference; each comes first for a share of keys
    proportional to its weight, and removing one moves only the keys it had."""
    return sorted(weights, key=lambda url: _score(key, url, weights[url]), reverse=True)


def _score(key: str, url: str, weight: int) -> float:
    digest = hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest()
    uniform = (int.from_bytes(digest, "big") + 0.5) / 2**64  # in (0, 1)
    return -weight / math.log(uniform)


def plan(hint: RouteHint, weights: Mapping[str, int]) -> Route:
    """The route of one request over the endpoints (``weights``: their configured caps)."""
    ranking = rendezvous(hint.key, weights)
    previous = hint.previous
    if previous is None or previous not in weights:  # a first turn, or an endpoint gone
        return Route(ranking, sticky=False)
    ranking.remove(previous)
    return Route([previous, *ranking], sticky=True)


def choose(
    ranking: Sequence[str], loads: Mapping[str, Load], bound: float, wait: bool,
    floor: float = LOAD_FLOOR,
) -> Choice:  # fmt: skip
    """What ``SLOT_ROUTE`` decides, given every endpoint's load (the reference for tests)."""
    usable = [url for url in ranking if loads[url].eligible]
    total = sum(loads[url].inflight for url in usable)
    capacity = sum(loads[url].cap for url in usable)
    if not capacity:
        return Choice(None)
    share = bound * max((total + 1) / capacity, floor)  # per slot of capacity
    pick = next((url for url in usable if within(loads[url], share)), None)
    if pick is not None and loads[pick].inflight < loads[pick].cap:
        return Choice(pick)
    if pick is not None and pick == ranking[0] and wait:
        return Choice(None, wait=True)
    best = max(usable, key=lambda url: loads[url].cap - loads[url].inflight)
    return Choice(best if loads[best].inflight < loads[best].cap else None)


def within(load: Load, share: float) -> bool:
    """Whether one more request keeps an endpoint within its bounded share of the load."""
    return load.inflight + 1 <= math.ceil(share * load.cap)
