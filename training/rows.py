"""From one chunk of input lines to output rows: render, tokenize, apply the length policies.

:class:`RowBuilder` holds one compiled template and the backend tokenizer; one lives in each
process of the job. Rendering (pure Python) and tokenizing (the tokenizer releases the GIL) are
separate steps so :mod:`training.parallel` can overlap them. Records with the server's token
ids give rows from those ids (:mod:`training.id_rows`), checked against the rendered rows.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from training.chat_template import compile_template, reads_variable
from training.id_rows import IdRow, difference, id_rows, show
from training.records import Record, RecordError, parse_line, specforge_row
from training.render import (
    PerTurn,
    Render,
    RowPlan,
    TemplateError,
    TurnText,
    conversation_turns,
    plan_rows,
    span_config,
)
from training.sink import OutRow

FinishPolicy = Literal["keep", "drop", "flag"]
TruncatePolicy = Literal["drop", "turn"]
Source = Literal["auto", "ids", "template"]


@dataclass(frozen=True, slots=True)
class JobConfig:
    """Everything a RowBuilder needs besides the tokenizer (picklable)."""

    template: str
    template_name: str
    special_map: dict[str, str]
    end_tokens: tuple[str, ...]
    max_length: int | None
    on_length: FinishPolicy
    truncate: TruncatePolicy
    per_turn: PerTurn
    source: Source = "auto"


@dataclass(slots=True)
class Outcome:
    """The result of one input line: its rows, or why it was skipped, and its counters."""

    line: int
    record_id: str | None = None
    error: str | None = None
    rows: list[OutRow] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    cut: int = 0
    checks: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    spliced: int = 0
    reasoning_dropped: int = 0
    unmasked: int = 0
    split: bool = False
    from_ids: int = 0
    drift_checks: int = 0
    drift: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Planned:
    """A parsed and rendered record: its template rows, and whether its rows come from ids."""

    outcome: Outcome
    record: Record
    rows: list[RowPlan]
    from_ids: bool
    template_error: str | None = None


class RowBuilder:
    """Renders and tokenizes chunks of lines; one per process."""

    def __init__(self, backend: Any, cfg: JobConfig) -> None:
        """Keep the backend tokenizer and compile the template once."""
        self.backend = backend
        self.cfg = cfg
        self.template = compile_template(cfg.template)
        self.span_cfg = span_config(cfg.template, cfg.template_name, cfg.end_tokens)
        self.renders_tools = reads_variable(self.template, cfg.template, "tools")

    def render_for(
        self, kwargs: Mapping[str, Any], tools: list[dict[str, Any]] | None = None
    ) -> Render:
        """Return a render function with the tokenizer's special tokens, the record's kwargs
        and its tools (as transformers' ``apply_chat_template(tools=...)`` passes them)."""
        ctx = {**self.cfg.special_map, **kwargs}
        template = self.template

        def render(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
            """Render messages as transformers' apply_chat_template(tokenize=False) does."""
            text: str = template.render(
                messages=list(messages),
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **ctx,
            )
            return text

        return render

    def plan(self, line_no: int, line: bytes) -> tuple[Record, list[RowPlan], list[TurnText]]:
        """Parse and render one line: its record, row plans and rendered turns."""
        record = parse_line(line)
        return record, *self.render_record(line_no, record)

    def render_record(self, line_no: int, record: Record) -> tuple[list[RowPlan], list[TurnText]]:
        """Render a record's turns and group them into rows."""
        from jinja2 import TemplateError as JinjaError

        if record.tools and not self.renders_tools:
            raise TemplateError(
                f"chat template {self.cfg.template_name!r} does not render tools, and record "
                f"{record.id} (line {line_no}) has them: use the target's tool-calling template"
            )
        render = self.render_for(record.template_kwargs, record.tools)
        cuts = [t.finish_reason == "length" for t in record.turns]
        try:
            turns = conversation_turns(
                record.messages, record.assistant_at, render, self.span_cfg, cuts
            )
        except TemplateError as exc:
            raise TemplateError(f"{exc} (line {line_no}, id {record.id})") from None
        except (JinjaError, TypeError, ValueError) as exc:
            # A template refusing one conversation (odd roles, tool calls) spoils only that row.
            raise RecordError(f"chat template error: {exc}") from None
        return plan_rows(turns, self.cfg.per_turn), turns

    def process(self, chunk: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        """Render, tokenize and apply the length policies to a chunk of lines."""
        return self.tokenize_chunk(self.render_chunk(chunk))

    def render_chunk(self, chunk: Sequence[tuple[int, bytes]]) -> Rendered:
        """Parse and render a chunk of lines (the pure-Python half of the work)."""
        outcomes: list[Outcome] = []
        planned: list[Planned] = []
        for line_no, line in chunk:
            try:
                found = self.plan_line(line_no, line)
            except RecordError as exc:
                outcomes.append(Outcome(line_no, error=str(exc)))
                continue
            outcomes.append(found.outcome)
            planned.append(found)
        return outcomes, planned

    def plan_line(self, line_no: int, line: bytes) -> Planned:
        """Parse one line, choose where its rows come from, and render it.

        A record with ids survives a template that cannot render it: the cross-check says so.
        """
        record = parse_line(line)
        source = self.cfg.source
        from_ids = source == "ids" or (source == "auto" and record.has_ids)
        if from_ids and not record.has_ids:
            raise RecordError("no token ids in the record (--source ids)")
        outcome = Outcome(line_no, record.id)
        try:
            rows, turns = self.render_record(line_no, record)
        except (TemplateError, RecordError) as exc:
            if not from_ids:
                raise
            return Planned(outcome, record, [], True, str(exc))
        outcome.split = len(rows) > 1
        outcome.spliced = sum(t.spliced for t in turns)
        outcome.reasoning_dropped = sum(t.reasoning_dropped for t in turns)
        outcome.unmasked = sum(r.unmasked for r in rows)
        return Planned(outcome, record, rows, from_ids)

    def tokenize_chunk(self, rendered: Rendered) -> list[Outcome]:
        """Tokenize a rendered chunk and build its rows (the tokenizer releases the GIL)."""
        outcomes, planned = rendered
        encoded = self.encode([row for p in planned for row in p.rows])
        for p in planned:
            built = [(row, *next(encoded)) for row in p.rows]
            if p.from_ids:
                self.rows_from_ids(p, built)
                continue
            for row, prompt, span, starts in built:
                self.finish_row(p.outcome, p.record, row, len(built) > 1, prompt, span, starts)
        return outcomes

    def encode(self, rows: Sequence[RowPlan]) -> Iterator[tuple[Any, Any, list[int]]]:
        """Tokenize prompts and spans in two batch calls; yield (prompt enc, span enc, starts)."""
        need = [bool(r.earlier) for r in rows]
        cut = [r.span_mask_end < len(r.span) for r in rows]
        fast_texts = [r.prompt for r, n in zip(rows, need, strict=True) if not n]
        fast_texts += [r.span for r, c in zip(rows, cut, strict=True) if not c]
        slow_texts = [r.prompt for r, n in zip(rows, need, strict=True) if n]
        slow_texts += [r.span for r, c in zip(rows, cut, strict=True) if c]
        # Offsets cost time: only rows with earlier trained turns or a cut span ask for them.
        fast = iter(self.backend.encode_batch_fast(fast_texts, add_special_tokens=False))
        slow = iter(self.backend.encode_batch(slow_texts, add_special_tokens=False))
        prompts = [next(slow) if n else next(fast) for n in need]
        spans = [next(slow) if c else next(fast) for c in cut]
        for prompt, span, n in zip(prompts, spans, need, strict=True):
            yield prompt, span, _starts(prompt) if n else []

    def finish_row(
        self,
        outcome: Outcome,
        record: Record,
        row: RowPlan,
        split: bool,
        prompt: Any,
        span: Any,
        starts: list[int],
    ) -> None:
        """Check prompt tokens, apply the length policies, and keep or drop one rendered row."""
        ids, mask, prompt_len = _row_lists(row, prompt, span, starts)
        self.check_prompts(outcome, record, row, prompt_len, starts)
        cuts = [(e.turn, bisect_left(starts, e.context_end)) for e in row.earlier]
        self.keep(outcome, record, row.turns(), split, ids, mask, cuts)

    def rows_from_ids(self, p: Planned, built: list[tuple[RowPlan, Any, Any, list[int]]]) -> None:
        """Build a record's rows from its ids, each checked against the template's row."""
        rows, p.outcome.unmasked = id_rows(p.record, self.cfg.per_turn)
        p.outcome.split = len(rows) > 1
        rendered = {}
        for plan, prompt, span, starts in built:  # the template's rows, for the cross-checks
            ids, mask, prompt_len = _row_lists(plan, prompt, span, starts)
            self.check_prompts(p.outcome, p.record, plan, prompt_len, starts)
            rendered[plan.last] = ids, mask
        split = len(rows) > 1
        for row in rows:
            p.outcome.from_ids += 1
            self.cross_check(p, row, split, rendered.get(row.last))
            self.keep(p.outcome, p.record, row.turns, split, row.ids, row.mask, list(row.cuts))

    def cross_check(
        self, p: Planned, row: IdRow, split: bool, rendered: tuple[array[int], Any] | None
    ) -> None:
        """Count a row from ids that differs from the template's, with where and how."""
        p.outcome.drift_checks += 1
        row_id = _row_id(p.record, row.last, split)
        if rendered is None:
            reason = p.template_error or "the template splits this conversation into other rows"
            p.outcome.drift.append({"id": row_id, "what": "template", "reason": reason[:300]})
            return
        found = difference(row.ids, row.mask, *rendered)
        if found is None:
            return
        at, what = found
        decode = self._decode
        p.outcome.drift.append(
            {"id": row_id, "what": what, "position": at, "ids": show(decode, row.ids, at),
             "template": show(decode, rendered[0], at)}
        )  # fmt: skip

    def _decode(self, ids: list[int]) -> str:
        text: str = self.backend.decode(ids, skip_special_tokens=False)
        return text

    def keep(
        self,
        outcome: Outcome,
        record: Record,
        turns: tuple[int, ...],
        split: bool,
        ids: array[int],
        mask: Any,
        cuts: list[tuple[int, int]],
    ) -> None:
        """Apply the length policies to a row ending at ``turns[-1]``; keep it or count why not."""
        fitted = self.fit(turns[-1], ids, mask, cuts)
        if fitted is None:
            outcome.dropped.append("too_long")
            return
        ids, mask, last = fitted
        outcome.cut += last != turns[-1]
        trained = [t for t in turns if t <= last]
        truncated = any(record.turns[t].finish_reason == "length" for t in trained)
        if truncated and self.cfg.on_length == "drop":
            outcome.dropped.append("finish_length")
            return
        row_id = _row_id(record, last, split)
        history = record.messages[: record.assistant_at[last] + 1]
        reason = record.turns[last].finish_reason
        row_json = specforge_row(row_id, history, reason, record.template_kwargs, record.tools)
        line = json.dumps(row_json, ensure_ascii=False)
        outcome.rows.append(OutRow(row_id, ids, mask, truncated, line))

    def fit(
        self, last: int, ids: array[int], mask: Any, cuts: list[tuple[int, int]]
    ) -> tuple[array[int], Any, int] | None:
        """Return (ids, mask, last turn) within max_length, cut at a turn if allowed, or None.

        ``cuts``: (earlier turn, token index where its context ends), in order.
        """
        limit = self.cfg.max_length
        if limit is None or len(ids) <= limit:
            return ids, mask, last
        if self.cfg.truncate != "turn":
            return None
        for turn, size in reversed(cuts):
            if size <= limit:
                return ids[:size], mask[:size], turn
        return None

    def check_prompts(
        self, outcome: Outcome, record: Record, row: RowPlan, prompt_len: int, starts: list[int]
    ) -> None:
        """Compare each trained turn's prompt length with the server's prompt_tokens."""
        lengths = {e.turn: e.prompt_end for e in row.earlier}
        for turn in row.turns():
            expected = record.turns[turn].prompt_tokens
            if expected is None:
                continue
            got = prompt_len if turn == row.last else bisect_left(starts, lengths[turn])
            outcome.checks += 1
            if got != expected:
                outcome.mismatches.append(
                    {"id": record.id, "turn": turn, "server": expected, "rendered": got}
                )


def _row_id(record: Record, last: int, split: bool) -> str:
    """A row's id: the record's, with the turn when the conversation gives several rows."""
    return f"{record.id}-t{last}" if split else record.id


def _row_lists(
    row: RowPlan, prompt: Any, span: Any, starts: list[int]
) -> tuple[array[int], Any, int]:
    """Return a row's input_ids (int32), loss_mask (int8) and prompt length."""
    import numpy as np

    p_ids, s_ids = prompt.ids, span.ids
    n_span = len(s_ids)
    if row.span_mask_end < len(row.span):
        n_span = bisect_left(_starts(span), row.span_mask_end)
    ids = array("i", p_ids)
    ids.extend(s_ids)
    mask = np.zeros(len(ids), dtype=np.int8)
    mask[len(p_ids) : len(p_ids) + n_span] = 1
    for e in row.earlier:
        mask[bisect_left(starts, e.prompt_end) : bisect_left(starts, e.mask_end)] = 1
    return ids, mask, len(p_ids)


def _starts(encoding: Any) -> list[int]:
    """Return the tokens' start character offsets (non-decreasing)."""
    return [start for start, _ in encoding.offsets]


Rendered = tuple[list[Outcome], list[Planned]]
