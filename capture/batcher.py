"""Rows from many task threads into one forward pass, up to a token budget.

Each task thread hands in its row and waits; one thread takes what is waiting (after a
short linger for the batch to fill): the oldest row and the rows nearest it in length, up to
the budget (padded tokens: rows x longest) and to a bound on padding, runs the model and
gives each thread its row's states. A row longer than the budget runs alone. The states may
still be on their way from the GPU: each row waits for them in its own thread, so the next
batch starts at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from capture.forward import States

Forward = Callable[[list[list[int]], tuple[int, int, int]], list[States]]


class Runner(Protocol):
    """What the row processor asks for one row's states."""

    def run(self, ids: list[int], aux: tuple[int, int, int]) -> States: ...

    def close(self) -> None: ...


class Unbatched:
    """Each row's forward in its own task thread: for a backend that batches elsewhere (vLLM
    servers), so one row's error is its own, not its batch's."""

    def __init__(self, forward: Forward) -> None:
        self.forward = forward

    def run(self, ids: list[int], aux: tuple[int, int, int]) -> States:
        """This row's states."""
        states = self.forward([ids], aux)[0]
        states.wait()
        return states

    def close(self) -> None:
        """Nothing runs in the background."""


@dataclass
class _Waiting:
    ids: list[int]
    aux: tuple[int, int, int]
    future: Future[States] = field(default_factory=Future)


# Padded tokens a batch may compute beyond its rows' own (the GPU's time on them is lost).
MAX_PADDING = 0.05


def take_batch(
    waiting: list[_Waiting], budget: int, max_padding: float = MAX_PADDING
) -> list[_Waiting]:
    """The oldest row of ``waiting`` and those nearest it in length (same aux layers), grown
    while the padded size fits ``budget`` and pads at most ``max_padding``; at least one row."""
    first = waiting[0]
    by_length = sorted((w for w in waiting if w.aux == first.aux), key=lambda w: len(w.ids))
    lo = hi = next(i for i, w in enumerate(by_length) if w is first)
    size = _Size(len(first.ids), len(first.ids), 1)
    while True:
        grown = [
            (size.plus(len(by_length[j].ids)), j)
            for j in (lo - 1, hi + 1)
            if 0 <= j < len(by_length)
        ]
        fits = [(s, j) for s, j in grown if s.padded <= min(budget, s.real * (1 + max_padding))]
        if not fits:
            break
        size, j = min(fits, key=lambda sj: sj[0].padded - sj[0].real)
        lo, hi = min(lo, j), max(hi, j)
    return by_length[lo : hi + 1]


@dataclass(frozen=True)
class _Size:
    real: int  # the rows' own tokens
    longest: int
    rows: int

    @property
    def padded(self) -> int:
        return self.longest * self.rows

    def plus(self, tokens: int) -> _Size:
        return _Size(self.real + tokens, max(self.longest, tokens), self.rows + 1)


class Batcher:
    """Collects rows and runs them in batches on one thread."""

    def __init__(self, forward: Forward, budget: int, linger_s: float) -> None:
        self.forward = forward
        self.budget = budget
        self.linger_s = linger_s
        self._waiting: list[_Waiting] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="capture-batcher", daemon=True)
        self._thread.start()

    def run(self, ids: list[int], aux: tuple[int, int, int]) -> States:
        """This row's states, computed in some batch."""
        item = _Waiting(ids, aux)
        with self._cond:
            self._waiting.append(item)
            self._cond.notify()
        states = item.future.result()
        states.wait()  # its copy from the device, if one is still in flight
        return states

    def close(self) -> None:
        """Stop after the current batch."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while batch := self._next():
            try:
                states = self.forward([w.ids for w in batch], batch[0].aux)
            except BaseException as exc:  # handed to the rows' threads, which decide
                for w in batch:
                    w.future.set_exception(exc)
                continue
            for w, s in zip(batch, states, strict=True):
                w.future.set_result(s)

    def _next(self) -> list[_Waiting]:
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed:
                return []
        time.sleep(self.linger_s)  # let the other threads' rows join this batch
        with self._cond:
            batch = take_batch(self._waiting, self.budget)
            taken = {id(w) for w in batch}
            self._waiting = [w for w in self._waiting if id(w) not in taken]
        return batch
