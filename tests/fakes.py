"""In-memory stand-ins for the Redis-backed parts, for unit tests only.

Integration tests use a real Redis and real processes; these fakes let the logic around the
store (the task's retry mapping, the processor, the feeder, the collector loop) be tested on
its own. Each keeps the contract of the real method it replaces, nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from common import checkpoint_log, errors
from common.models import Checkpoint, Failure, GenParams, Sample, SourceRef, TurnResult, Usage
from common.request_store import RequestRef
from common.store import RunCounts, Taken


def sample(sample_id: str = "s1", turns: tuple[str, ...] = ("q1",)) -> Sample:
    return Sample(
        id=sample_id, system=None, user_turns=list(turns),
        source=SourceRef(dataset="d", split=None, row=0, format="turns"),
    )  # fmt: skip


def turn(text: str = "answer", tokens: int = 7, reason: str = "stop") -> TurnResult:
    return TurnResult(
        content=text, finish_reason=reason, usage=Usage(prompt_tokens=3, completion_tokens=tokens),
        latency_s=0.25, endpoint="http://e/v1", model="m",
    )  # fmt: skip


class FakeLock:
    def __init__(self, free: bool = True) -> None:
        self.free = free
        self.held = False
        self.token = "tok"

    def hold(self) -> bool:
        self.held = self.held or self.free
        return self.held

    def release(self) -> None:
        self.held = False


@dataclass
class FakeStore:
    """The subset of ``RunStore`` each unit under test calls, in memory."""

    run: str = "r"
    params_: GenParams | None = field(default_factory=GenParams)
    samples: dict[str, Sample] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    accepted: set[str] = field(default_factory=set)
    leases: dict[str, str] = field(default_factory=dict)
    partial: dict[str, list[TurnResult]] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    checkpoint_logs: dict[str, tuple[str, str]] = field(default_factory=dict)  # header, log
    requests: dict[str, RequestRef] = field(default_factory=dict)  # running, by sample
    results: dict[str, str] = field(default_factory=dict)
    failed: dict[str, Failure] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    collecting_: list[str] = field(default_factory=list)
    lost_on_renew: set[str] = field(default_factory=set)
    lock: FakeLock = field(default_factory=FakeLock)
    meta: dict[str, str] = field(default_factory=dict)
    out_of_rotation: dict[str, str] = field(default_factory=dict)  # endpoint -> why

    def add(self, s: Sample) -> None:
        self.samples[s.id] = s
        self.pending.add(s.id)
        self.accepted.add(s.id)

    # worker side
    def params(self) -> GenParams | None:
        return self.params_

    def take(
        self, sample_id: str, owner: str, ttl_s: float, retries: int = 0, ceiling: int = 0
    ) -> Taken:
        # The attempts ceiling is the Lua script's (tests/integration/test_bounded_attempts.py).
        if sample_id not in self.pending:
            return Taken("done")
        if self.leases.get(sample_id, owner) != owner:
            return Taken("leased")
        self.leases[sample_id] = owner
        self.counters[f"attempts:{sample_id}"] = self.attempts(sample_id) + 1
        partial = list(self.partial.get(sample_id, []))
        ckpt = self.checkpoints.get(sample_id)
        return Taken("ok", self.attempts(sample_id), self.samples.get(sample_id), partial, ckpt)

    def release(self, sample_id: str, owner: str) -> None:
        if self.leases.get(sample_id) == owner:
            del self.leases[sample_id]

    def renew(self, held: list[tuple[str, str]], ttl_s: float) -> list[str]:
        return [i for i, _ in held if i in self.lost_on_renew]

    def attempts(self, sample_id: str) -> int:
        return self.counters.get(f"attempts:{sample_id}", 0)

    def save_partial(self, sample_id: str, token: str, turns: list[TurnResult]) -> None:
        if self.leases.get(sample_id) != token or sample_id not in self.pending:
            raise errors.LeaseLost(f"answered turns of {sample_id} refused")
        self.partial[sample_id] = list(turns)
        self.checkpoints.pop(sample_id, None)
        self.checkpoint_logs.pop(sample_id, None)  # SAVE_PARTIAL drops the log and request
        self.requests.pop(sample_id, None)

    def save_checkpoint(
        self, sample_id: str, token: str, header: str, piece: str, log_bytes: int = 0
    ) -> int:
        """SAVE_CHECKPOINT's rules; the header is there while ``checkpoints`` names the id."""
        if self.leases.get(sample_id) != token:
            return 0
        if header:
            self.checkpoint_logs[sample_id] = (header, piece)
        else:
            head, log = self.checkpoint_logs.get(sample_id, ("", ""))
            if sample_id not in self.checkpoints or len(log.encode()) != log_bytes:
                return -1
            self.checkpoint_logs[sample_id] = (head, log + piece)
        head, log = self.checkpoint_logs[sample_id]
        found = checkpoint_log.decode(head, log)
        assert found is not None
        self.checkpoints[sample_id] = found
        return len(log.encode())

    def record_request(self, sample_id: str, ref: RequestRef) -> bool:
        if self.leases.get(sample_id) != ref.token:
            return False
        self.requests[sample_id] = ref
        return True

    def pop_own_request(self, sample_id: str, token: str) -> RequestRef | None:
        ref = self.requests.get(sample_id)
        return self.requests.pop(sample_id) if ref is not None and ref.token == token else None

    def pop_requests(self, ids: list[str]) -> dict[str, RequestRef]:
        return {i: self.requests.pop(i) for i in ids if i in self.requests}

    def store_result(
        self, sample_id: str, record_json: str, completion_tokens: int, token: str = ""
    ) -> str:
        if self.leases.get(sample_id, token) != token:
            return "lease_lost"
        self.leases.pop(sample_id, None)
        if sample_id not in self.pending:
            return "duplicate"
        self.pending.discard(sample_id)
        self.partial.pop(sample_id, None)
        self.checkpoints.pop(sample_id, None)
        self.results[sample_id] = record_json
        self.ready.append(sample_id)
        return "stored"

    def store_failure(self, sample_id: str, failure: Failure, token: str = "") -> str:
        if self.leases.get(sample_id, token) != token:
            return "lease_lost"
        if sample_id not in self.pending:
            return "duplicate"
        self.pending.discard(sample_id)
        self.checkpoints.pop(sample_id, None)
        self.failed[sample_id] = failure
        return "stored"

    def incr(self, counter: str, amount: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + amount

    def pin_model(self, model: str, endpoint: str) -> str:
        self.model = getattr(self, "model", None) or model
        return self.model

    def endpoints_out(self) -> dict[str, str]:
        return dict(self.out_of_rotation)

    def take_endpoint_out(self, endpoint: str, reason: str) -> bool:
        return self.out_of_rotation.setdefault(endpoint, reason) == reason

    def bring_endpoints_back(self) -> None:
        self.out_of_rotation.clear()

    def refused_endpoints(self) -> dict[str, str]:
        return {}

    def meta_value(self, name: str) -> str | None:
        return self.meta.get(name)

    def set_meta_once(self, name: str, value: str) -> bool:
        return self.meta.setdefault(name, value) == value

    def drop_meta(self, name: str) -> None:
        self.meta.pop(name, None)

    def failures(self) -> dict[str, Failure]:
        return dict(self.failed)

    def some_failures(self, count: int) -> list[Failure]:
        return list(self.failed.values())[:count]

    def counts(self) -> RunCounts:
        total, failed = len(self.accepted), len(self.failed)
        in_flight = len(self.leases)
        return RunCounts(self.run, total, len(self.pending), in_flight, failed, 0, 0, 0, 0, None)

    # producer side
    def known(self, ids: list[str]) -> list[bool]:
        return [i in self.accepted for i in ids]

    def beat(self, producer: str, alive: bool = True) -> None:
        self.counters["beats"] = self.counters.get("beats", 0) + 1

    def accept(self, samples: list[Sample], producer: str = "") -> list[bool]:
        fresh = [s.id not in self.accepted for s in samples]
        for s, new in zip(samples, fresh, strict=True):
            if new:
                self.add(s)
        return fresh

    def pending_count(self) -> int:
        return len(self.pending)

    # collector side
    def take_ready(self, token: str, limit: int) -> list[str]:
        if self.collecting_:
            return list(self.collecting_)
        taken, self.ready = self.ready[:limit], self.ready[limit:]
        self.collecting_ += taken
        return taken

    def results_for(self, ids: list[str]) -> list[str | None]:
        return [self.results.get(i) for i in ids]

    def commit_collected(self, token: str, ids: list[str]) -> int:
        n = sum(1 for i in ids if self.results.pop(i, None) is not None)
        self.counters["written"] = self.counters.get("written", 0) + n
        self.collecting_ = [i for i in self.collecting_ if i not in ids]
        return n

    def collector_lock(self, ttl_s: float) -> FakeLock:
        return self.lock


def store_of(n: int) -> FakeStore:
    """A store with ``n`` pending one-turn samples, ``s0`` to ``s{n-1}``."""
    store = FakeStore()
    for i in range(n):
        store.add(sample(f"s{i}"))
    return store


class FakeClient:
    """An endpoint client answering from a script: each entry a TurnResult or an exception."""

    endpoint = "http://e/v1"

    def __init__(self, *script: Any, probe_error: Exception | None = None) -> None:
        self.script = list(script)
        self.calls: list[list[dict[str, Any]]] = []
        self.options: list[dict[str, Any]] = []  # each call's turn, resume and progress
        self.probe_error = probe_error
        self.continuing: bool | None = None  # what continues() says: learned or not

    def model(self) -> str:
        return "m"

    def continues(self) -> bool | None:
        return self.continuing

    def probe(self, timeout: float | None = None) -> None:
        if self.probe_error is not None:
            raise self.probe_error

    def complete(self, messages: Any, params: Any, check: Any = None, **options: Any) -> TurnResult:
        """A script entry may be a callable of (progress): it plays the stream's checkpoints."""
        self.calls.append(messages)
        self.options.append(options)
        if check is not None:
            check()
        step = self.script.pop(0)
        if callable(step):
            step = step(options.get("progress"))
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[no-any-return]


class FakeEndpoints:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.hints: list[Any] = []  # the routing hint of each request

    @contextlib.contextmanager
    def borrow(
        self, check: Any = None, hint: Any = None, avoid: Any = frozenset()
    ) -> Iterator[FakeClient]:
        self.hints.append(hint)
        yield self.client


class FakeObserver:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def turn(self, run: str, t: TurnResult) -> None:
        self.events.append(("turn", t.usage.completion_tokens))

    def error(self, run: str, exc: Exception) -> None:
        self.events.append(("error", type(exc).__name__))

    def finished(self, run: str, tokens: int, kept: bool) -> None:
        self.events.append(("finished", (tokens, kept)))
