"""The producer: rows -> samples -> Redis (once) -> task messages, with backpressure."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from common.ids import sample_id
from common.models import GenParams, Sample, SourceRef
from common.store import RunStore
from producer.formats import InvalidRow, detect_format, to_prompt
from producer.preflight import prompt_estimate
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
            )
        return why


@dataclass
class Feeder:
    """Turns rows into accepted samples and published tasks."""

    store: RunStore
    params: GenParams
    info: SourceInfo
    publish: Callable[[list[str]], object]
    fmt: str = "auto"
    max_pending: int = 10_000
    # max_model_len - max_tokens: a row whose first prompt cannot fit is skipped (None: unknown).
    max_prompt_tokens: int | None = None
    on_invalid: Callable[[int, str], None] = lambda row, reason: None
    on_progress: Callable[[EnqueueCounts], None] = lambda counts: None
    wait: Callable[[float], None] = time.sleep
    counts: EnqueueCounts = field(default_factory=EnqueueCounts)
    _seen: set[str] = field(default_factory=set)

    def run(self, rows: Iterable[RawRow], limit: int | None = None) -> EnqueueCounts:
        """Feed every row (the first ``limit``), blocking while the run has too much pending."""
        self.counts.format = None if self.fmt == "auto" else self.fmt
        self.counts.max_prompt_tokens = self.max_prompt_tokens
        for batch in _batches(islice(rows, limit), min(BATCH, self.max_pending)):
            self._feed(batch)
            self.on_progress(self.counts)
        return self.counts

    def _feed(self, rows: list[RawRow]) -> None:
        samples = [s for s in (self._sample(row) for row in rows) if s is not None]
        known = self.store.known([s.id for s in samples])
        fresh = [s for s, seen in zip(samples, known, strict=True) if not seen]
        self.counts.present += len(samples) - len(fresh)
        self._wait_for_room(len(fresh))
        accepted = self.store.accept(fresh)
        new_ids = [s.id for s, ok in zip(fresh, accepted, strict=True) if ok]
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
        except InvalidRow as exc:
            self._invalid(row.index, str(exc))
            return None
        system, turns = (
            self.params.system_for(prompt.system),
            self.params.turns_of(prompt.user_turns),
        )
        limit = self.max_prompt_tokens
        if limit is not None and prompt_estimate(system, turns) > limit:
            self.counts.too_long += 1
            return None
        sid = sample_id(system, turns, tool_identity(prompt.tools, self.params))
        if sid in self._seen:
            self.counts.duplicates += 1
            return None
        self._seen.add(sid)
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

    def _wait_for_room(self, wanted: int) -> None:
        # Backpressure: a million-row source must not sit in Redis at once.
        while wanted and self.store.pending_count() + wanted > self.max_pending:
            self.wait(0.5)


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
