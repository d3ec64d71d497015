"""The producer: rows -> samples -> Redis (once) -> task messages, with backpressure."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import redis

from common.errors import RunRetired
from common.ids import sample_id
from common.models import GenParams, Sample, SourceRef
from common.store import ProducerStore
from producer.formats import InvalidRow, Prompt, detect_format, to_prompt
from producer.preflight import SAMPLE_ROWS, advice, prompt_estimate
from producer.readers import RawRow, SourceInfo
from producer.tools import tool_identity

BATCH = 256


@dataclass
class EnqueueCounts:
    """What one ``enqueue`` did."""

    enqueued: int = 0
    present: int = 0
    duplicates: int = 0
    invalid: int = 0
    too_long: int = 0
    rows: int = 0
    format: str | None = None
    invalid_examples: list[str] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)  # why invalid rows were skipped
    max_prompt_tokens: int | None = None
    advice: str | None = None  # a --max-tokens that leaves room for the prompts, when some lack it

    def line(self) -> str:
        """The one-line summary printed at the end: the counts, then why rows were skipped."""
        head = (
            f"enqueued {self.enqueued}, already present {self.present}, "
            f"duplicates {self.duplicates}, invalid {self.invalid}"
        )
        if self.too_long:
            head += f", too long {self.too_long}"
        return f"{head} ({'; '.join([f'read {self.rows} rows', *self._why()])})"

    def _why(self) -> list[str]:
        why = []
        if self.present:
            why.append("already present: accepted into this run by an earlier enqueue")
        if self.duplicates:
            why.append("duplicates: the same prompt as an earlier row of this source")
        if self.reasons:
            parts = (f"{n} {reason}" for reason, n in self.reasons.most_common())
            why.append(f"invalid: {', '.join(parts)}")
        if self.too_long:
            why.append(
                f"too long: first prompt over the {self.max_prompt_tokens} tokens that "
                "max_tokens leaves of the servers' max_model_len"
                + (f" ({self.advice})" if self.advice else "")
            )
        return why


@dataclass
class Feeder:
    """Turns rows into accepted samples and published tasks."""

    store: ProducerStore
    params: GenParams
    info: SourceInfo
    publish: Callable[[list[str]], object]
    fmt: str = "auto"
    max_pending: int = 10_000
    # max_model_len - max_tokens: a row whose first prompt cannot fit is skipped (None: unknown).
    max_prompt_tokens: int | None = None
    max_pending_bytes: int = 4 << 30
    max_row_bytes: int = 4 << 20
    on_invalid: Callable[[int, str], None] = lambda row, reason: None
    on_progress: Callable[[EnqueueCounts], None] = lambda counts: None
    # Creates the run (its parameters frozen) just before its first sample is accepted: an
    # enqueue that accepts nothing leaves no run behind.
    claim: Callable[[], None] = lambda: None
    wait: Callable[[float], None] = time.sleep
    counts: EnqueueCounts = field(default_factory=EnqueueCounts)
    # Names this producer's heartbeat in the run (``runs retire`` waits while one is live).
    producer: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _seen: set[str] = field(default_factory=set)
    _sizes: dict[str, int] = field(default_factory=dict)  # the batch's samples, text bytes
    _fed: list[int] = field(default_factory=lambda: [0, 0])  # samples and bytes accepted
    _estimates: list[int] = field(default_factory=list)  # of the first SAMPLE_ROWS prompts
    _claimed: bool = False

    def run(self, rows: Iterable[RawRow], limit: int | None = None) -> EnqueueCounts:
        """Feed every row (the first ``limit``), blocking while the run has too much pending."""
        self.counts.format = None if self.fmt == "auto" else self.fmt
        self.counts.max_prompt_tokens = self.max_prompt_tokens
        try:
            for batch in _batches(islice(rows, limit), min(BATCH, self.max_pending)):
                self._feed(batch)
                self.on_progress(self.counts)
            self._advise()
        finally:
            with contextlib.suppress(redis.RedisError, RunRetired):
                self.store.beat(self.producer, alive=False)
        return self.counts

    def _feed(self, rows: list[RawRow]) -> None:
        samples = [s for s in (self._sample(row) for row in rows) if s is not None]
        known = self.store.known([s.id for s in samples])
        fresh = [s for s, seen in zip(samples, known, strict=True) if not seen]
        self.counts.present += len(samples) - len(fresh)
        self._wait_for_room(len(fresh), sum(self._sizes[s.id] for s in fresh))
        if fresh and not self._claimed:
            self.claim()
            self._claimed = True
        accepted = self.store.accept(fresh, self.producer)
        new_ids = [s.id for s, ok in zip(fresh, accepted, strict=True) if ok]
        self._fed[0] += len(new_ids)
        self._fed[1] += sum(self._sizes[sid] for sid in new_ids)
        self._sizes.clear()
        self.counts.present += len(fresh) - len(new_ids)  # raced with another producer
        if new_ids:
            self.publish(new_ids)
        self.counts.enqueued += len(new_ids)

    def _sample(self, row: RawRow) -> Sample | None:
        self.counts.rows += 1
        try:
            if row.data is None:
                raise InvalidRow(row.error or "unreadable row")
            prompt = to_prompt(row.data, self._format_of(row.data))
            size = _text_bytes(prompt)
            if size > self.max_row_bytes:
                raise InvalidRow(f"{size} bytes of text, over EAGLEGEN_MAX_ROW_BYTES")
        except InvalidRow as exc:
            self._invalid(row.index, str(exc))
            return None
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            self._invalid(row.index, f"unreadable ({type(exc).__name__})")
            return None
        system, turns = (
            self.params.system_for(prompt.system),
            self.params.turns_of(prompt.user_turns),
        )
        estimate = prompt_estimate(system, turns)
        if len(self._estimates) < SAMPLE_ROWS:
            self._estimates.append(estimate)
        limit = self.max_prompt_tokens
        if limit is not None and estimate > limit:
            self.counts.too_long += 1
            return None
        sid = sample_id(system, turns, tool_identity(prompt.tools, self.params))
        if sid in self._seen:
            self.counts.duplicates += 1
            return None
        self._seen.add(sid)
        self._sizes[sid] = size
        source = SourceRef(
            dataset=self.info.dataset, split=self.info.split, row=row.index,
            format=self.counts.format or "?",
        )  # fmt: skip
        found = prompt.tools
        if found is None:
            return Sample(id=sid, system=prompt.system, user_turns=prompt.user_turns, source=source)
        return Sample(
            id=sid, system=prompt.system, user_turns=prompt.user_turns, source=source,
            tools=found.tools, tool_choice=found.tool_choice, script=found.messages,
        )  # fmt: skip

    def _advise(self) -> None:
        """Rows were too long: say which --max-tokens would leave them room."""
        if self.counts.too_long and self.max_prompt_tokens is not None:
            max_model_len = self.max_prompt_tokens + self.params.max_tokens
            self.counts.advice = advice(max_model_len, self._estimates)

    def _format_of(self, data: dict[str, object]) -> str:
        # Auto-detection is per file: the first readable row decides, the rest must match.
        if self.counts.format is None:
            found = detect_format(data)
            if found is None:
                raise InvalidRow("matches no known format (messages, conversations, turns, prompt)")
            self.counts.format = found
        return self.counts.format

    def _invalid(self, index: int, reason: str) -> None:
        self.counts.invalid += 1
        self.counts.reasons[reason_class(reason)] += 1
        self.on_invalid(index, reason)

    def _wait_for_room(self, wanted: int, wanted_bytes: int) -> None:
        # Backpressure: a million-row source must not sit in Redis at once, nor a few long
        # rows fill it. Bytes pending are estimated: the pending count times the mean size of
        # the samples this enqueue accepted (Redis keeps no byte count of a run).
        while wanted:
            pending = self.store.pending_count()
            fed, fed_bytes = self._fed
            mean = fed_bytes / fed if fed else wanted_bytes / wanted
            full = pending + wanted > self.max_pending or (
                pending and pending * mean + wanted_bytes > self.max_pending_bytes
            )
            if not full:
                return
            self.store.beat(self.producer)  # waiting for room is still feeding the run
            self.wait(0.5)


def prompt_estimates(
    rows: Iterable[RawRow], fmt: str, params: GenParams, limit: int = SAMPLE_ROWS
) -> list[int]:
    """Lower bounds of the first prompts' tokens of a source's first ``limit`` rows (rows
    that are not prompts left out), for a --max-tokens that leaves them room."""
    found: list[int] = []
    chosen = None if fmt == "auto" else fmt
    for row in islice(rows, limit):
        try:
            chosen = chosen or (detect_format(row.data) if row.data is not None else None)
            if chosen is None or row.data is None:
                continue
            prompt = to_prompt(row.data, chosen)
        except (InvalidRow, ValueError, TypeError, AttributeError, KeyError, RecursionError):
            continue
        system, turns = params.system_for(prompt.system), params.turns_of(prompt.user_turns)
        found.append(prompt_estimate(system, turns))
    return found


def _text_bytes(prompt: Prompt) -> int:
    texts = [prompt.system or "", *prompt.user_turns]
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)


def _batches(rows: Iterable[RawRow], size: int) -> Iterator[list[RawRow]]:
    # Never larger than max_pending, or waiting for room could never end.
    iterator = iter(rows)
    while batch := list(islice(iterator, size)):
        yield batch


def reason_class(reason: str) -> str:
    """A skip reason without its particulars, so that like reasons add up in the summary."""
    general = re.sub(r"\s*\(.*\)\s*$", "", reason)
    general = re.sub(r"'[^']*'", "'…'", general)
    return re.sub(r"(?<![\w-])\d+(?![\w-])", "N", general)
