"""The tokenize job: collector JSONL in, EAGLE-3 training rows out.

Each conversation is rendered with the target model's chat template (the tokenizer's, or a file)
and the record's own ``chat_template_kwargs``, exactly as the server rendered it. Rows hold
``input_ids`` and ``loss_mask``: 1 on what the model generated in the trained assistant turns
(reasoning with its think tokens where the model produced it, the answer, the end-of-turn
token), 0 on system, user and template scaffolding. How rows and masks are derived from the
template, and when a conversation becomes one row per assistant turn, is in
:mod:`training.render`.

Tokenization follows the server: the prompt ``P_k`` of a row's last turn is tokenized on its own
(the server tokenized exactly that string) and the generated text after it separately (the
model emitted new tokens there, so no BPE merge crosses that boundary). Earlier trained turns
sit inside ``P_k``; their masks come from the tokenizer's character offsets, never from
tokenizing pieces apart.

Prompt-token check: where a record carries the server's ``prompt_tokens`` for a turn, the count
of the row's tokens before that turn must equal it; mismatches (the usual sign that generation
and training used different templates) are counted and the first ids printed.

Length policies: rows over ``max_length`` are dropped, or (``truncate="turn"``) cut after the
last trained turn that fits. Turns that ended with ``finish_reason == "length"`` are kept,
dropped, or flagged in a ``truncated`` column; their mask stops at the generated text, since the
template's closing tokens were never generated.

Output in ``out_dir``: ``dataset/`` (``load_from_disk``-able, ``save_to_disk``'s layout: ``id``,
``input_ids`` int32, ``loss_mask`` int8, ``truncated`` if flagged), ``conversations.jsonl``
(SpecForge rows, one per output row, history as the server saw it) and ``stats.json``. Rows
stream to disk chunk by chunk (:mod:`training.sink`), so memory does not grow with the input.
Records with an id already seen are skipped (the collector's queue delivers at least once).

Speed: one process renders the next chunk while a thread tokenizes the current one (the
tokenizer releases the GIL). ``num_proc > 1`` renders and tokenizes chunks in a pool of spawned
processes (scripts calling it need the ``if __name__ == "__main__":`` guard), with a bounded
window and in input order, so the output is the same for any ``num_proc``.
"""

from __future__ import annotations

import json
import shutil
import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from training.records import Record, RecordError, iter_lines, parse_line, specforge_row
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
from training.sink import DatasetSink, OutRow

if TYPE_CHECKING:
    from rich.console import Console

FinishPolicy = Literal["keep", "drop", "flag"]
TruncatePolicy = Literal["drop", "turn"]

_EXAMPLES = 5
_BAD_EXAMPLES = 20


@dataclass
class TokenizeStats:
    """What the job read, wrote, dropped and checked; also written to ``stats.json``."""

    input: str
    output: str
    tokenizer: str
    tokenizer_vocab_size: int
    target_vocab_size: int
    template: str
    options: dict[str, Any]
    lines: int = 0
    records: int = 0
    bad_rows: int = 0
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    rows_out: int = 0
    tokens: int = 0
    masked_tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    cut_rows: int = 0
    flagged_truncated: int = 0
    split_conversations: int = 0
    spliced_turns: int = 0
    reasoning_dropped_turns: int = 0
    unmasked_turns: int = 0
    prompt_checks: int = 0
    prompt_mismatches: int = 0
    mismatch_examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the stats as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class JobConfig:
    """Everything a worker needs besides the tokenizer (picklable)."""

    template: str
    template_name: str
    special_map: dict[str, str]
    end_tokens: tuple[str, ...]
    max_length: int | None
    on_length: FinishPolicy
    truncate: TruncatePolicy
    per_turn: PerTurn


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


def compile_template(text: str) -> Any:
    """Compile a chat template in the sandboxed Jinja environment transformers uses.

    A private environment (not transformers' cached one) with faster lookups on plain data.
    """
    try:
        from transformers.utils.chat_template_utils import _cached_compile_jinja_template
    except ImportError:  # another transformers version: an equivalent environment
        template = _fallback_compile(text)
    else:
        template = _cached_compile_jinja_template(text)
    _fast_lookups(template.environment)
    return template


_DICT_ATTRS = frozenset(dir(dict))


def _fast_lookups(env: Any) -> None:
    """Speed up the sandbox's attribute checks, with identical results.

    The sandbox's verdict on ``obj.attr`` depends only on the type of ``obj`` and the name
    (``is_internal_attribute`` and ``modifies_known_mutable`` test types, never values), so it
    is cached per (type, name); ``message.content`` on a plain dict skips the failing
    ``getattr`` the sandbox tries before the key lookup.
    """
    slow_getattr, slow_safe = env.getattr, env.is_safe_attribute
    verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        """Return the sandbox's verdict, cached per (type, attribute name)."""
        key = (type(obj), attr)
        known = verdicts.get(key)
        if known is None:
            known = verdicts[key] = bool(slow_safe(obj, attr, value))
        return known

    def getattr_(obj: Any, attribute: str) -> Any:
        """Look up ``obj.attribute``; a plain dict's key directly, as the sandbox would."""
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except KeyError:
                return env.undefined(obj=obj, name=attribute)
        return slow_getattr(obj, attribute)

    env.is_safe_attribute = is_safe_attribute
    env.getattr = getattr_


def _fallback_compile(text: str) -> Any:
    """Compile with a Jinja sandbox configured like transformers' chat-template environment."""
    import datetime

    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        """Raise a template error from inside a template."""
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        """Serialise like transformers: no HTML escaping."""
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
    return env.from_string(text)


class Worker:
    """Renders and tokenizes chunks of lines; one per process."""

    def __init__(self, backend: Any, cfg: JobConfig) -> None:
        """Keep the backend tokenizer and compile the template once."""
        self.backend = backend
        self.cfg = cfg
        self.template = compile_template(cfg.template)
        self.span_cfg = span_config(cfg.template, cfg.template_name, cfg.end_tokens)

    def render_for(self, kwargs: Mapping[str, Any]) -> Render:
        """Return a render function with the tokenizer's special tokens and the record's kwargs."""
        ctx = {**self.cfg.special_map, **kwargs}
        template = self.template

        def render(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
            """Render messages as transformers' apply_chat_template(tokenize=False) does."""
            text: str = template.render(
                messages=list(messages),
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **ctx,
            )
            return text

        return render

    def plan(self, line_no: int, line: bytes) -> tuple[Record, list[RowPlan], list[TurnText]]:
        """Parse and render one line: its record, row plans and rendered turns."""
        from jinja2 import TemplateError as JinjaError

        record = parse_line(line)
        render = self.render_for(record.template_kwargs)
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
        return record, plan_rows(turns, self.cfg.per_turn), turns

    def process(self, chunk: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        """Render, tokenize and apply the length policies to a chunk of lines."""
        return self.tokenize_chunk(self.render_chunk(chunk))

    def render_chunk(self, chunk: Sequence[tuple[int, bytes]]) -> Rendered:
        """Parse and render a chunk of lines (the pure-Python half of the work)."""
        outcomes: list[Outcome] = []
        planned: list[tuple[Outcome, Record, list[RowPlan]]] = []
        for line_no, line in chunk:
            try:
                record, rows, turns = self.plan(line_no, line)
            except RecordError as exc:
                outcomes.append(Outcome(line_no, error=str(exc)))
                continue
            outcome = Outcome(line_no, record.id, split=len(rows) > 1)
            outcome.spliced = sum(t.spliced for t in turns)
            outcome.reasoning_dropped = sum(t.reasoning_dropped for t in turns)
            outcome.unmasked = sum(r.unmasked for r in rows)
            outcomes.append(outcome)
            planned.append((outcome, record, rows))
        return outcomes, planned

    def tokenize_chunk(self, rendered: Rendered) -> list[Outcome]:
        """Tokenize a rendered chunk and build its rows (the tokenizer releases the GIL)."""
        outcomes, planned = rendered
        encoded = self.encode([row for _, _, rows in planned for row in rows])
        for outcome, record, rows in planned:
            for row in rows:
                self.finish_row(outcome, record, row, len(rows) > 1, *next(encoded))
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
        """Check prompt tokens, apply the length policies, and keep or drop one row."""
        ids, mask, prompt_len = _row_lists(row, prompt, span, starts)
        self.check_prompts(outcome, record, row, prompt_len, starts)
        fitted = self.fit(row, ids, mask, starts)
        if fitted is None:
            outcome.dropped.append("too_long")
            return
        ids, mask, last = fitted
        outcome.cut += last != row.last
        trained = [t for t in row.turns() if t <= last]
        truncated = any(record.turns[t].finish_reason == "length" for t in trained)
        if truncated and self.cfg.on_length == "drop":
            outcome.dropped.append("finish_length")
            return
        row_id = f"{record.id}-t{last}" if split else record.id
        history = record.messages[: record.assistant_at[last] + 1]
        line = json.dumps(specforge_row(row_id, history), ensure_ascii=False)
        outcome.rows.append(OutRow(row_id, ids, mask, truncated, line))

    def fit(
        self, row: RowPlan, ids: array[int], mask: Any, starts: list[int]
    ) -> tuple[array[int], Any, int] | None:
        """Return (ids, mask, last turn) within max_length, cut at a turn if allowed, or None."""
        limit = self.cfg.max_length
        if limit is None or len(ids) <= limit:
            return ids, mask, row.last
        if self.cfg.truncate != "turn":
            return None
        for e in reversed(row.earlier):
            size = bisect_left(starts, e.context_end)
            if size <= limit:
                return ids[:size], mask[:size], e.turn
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


Rendered = tuple[list["Outcome"], list[tuple["Outcome", Record, list[RowPlan]]]]
_WORKER: Worker | None = None


def _init_worker(backend: Any, cfg: JobConfig) -> None:
    """Process-pool initializer: build this process's Worker."""
    import os

    # Each pool process is one core's worth of work; no nested tokenizer threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _WORKER
    _WORKER = Worker(backend, cfg)


def _work(chunk: list[tuple[int, bytes]]) -> list[Outcome]:
    """Process-pool task: process one chunk in this process's Worker."""
    assert _WORKER is not None
    return _WORKER.process(chunk)


def _outcomes(
    path: Path, backend: Any, cfg: JobConfig, num_proc: int, chunk_lines: int
) -> Iterator[tuple[int, list[Outcome]]]:
    """Yield (bytes read, outcomes) per chunk, in input order, in-process or from a pool."""
    if num_proc <= 1:
        yield from _pipelined(Worker(backend, cfg), iter_lines(path, chunk_lines))
        return
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    pending: deque[tuple[int, Future[list[Outcome]]]] = deque()
    with ProcessPoolExecutor(
        num_proc, mp_context=ctx, initializer=_init_worker, initargs=(backend, cfg)
    ) as pool:
        # A bounded window keeps memory flat: the file is never read far ahead of the writer.
        for done, chunk in iter_lines(path, chunk_lines):
            pending.append((done, pool.submit(_work, chunk)))
            if len(pending) >= 2 * num_proc:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()


def _pipelined(
    worker: Worker, chunks: Iterator[tuple[int, list[tuple[int, bytes]]]]
) -> Iterator[tuple[int, list[Outcome]]]:
    """Yield outcomes in order, tokenizing one chunk in a thread while the next is rendered.

    The tokenizer releases the GIL, so rendering (and the caller's Arrow writing) overlaps with
    tokenization: a single process then keeps both cores busy.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    pending: deque[tuple[int, Future[list[Outcome]]]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="eaglegen-tokenize") as pool:
        for done, chunk in chunks:
            pending.append((done, pool.submit(worker.tokenize_chunk, worker.render_chunk(chunk))))
            if len(pending) >= 2:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()


class _Collector:
    """Main-process side: merges outcomes into stats and writes rows and conversations."""

    def __init__(self, stats: TokenizeStats, conversations: Any, flag: bool) -> None:
        """Start with empty id set; rows go to the dataset and the conversations file."""
        self.stats = stats
        self.conversations = conversations
        self.flag = flag
        self.seen: set[str] = set()

    def merge(self, outcome: Outcome) -> list[OutRow]:
        """Count one outcome and return the rows to write (none for bad or duplicate lines)."""
        s = self.stats
        s.lines += 1
        if outcome.error is not None or outcome.record_id is None:
            s.bad_rows += 1
            if len(s.bad_examples) < _BAD_EXAMPLES:
                s.bad_examples.append({"line": outcome.line, "reason": outcome.error})
            return []
        if outcome.record_id in self.seen:
            s.duplicates += 1
            return []
        self.seen.add(outcome.record_id)
        s.records += 1
        for reason in outcome.dropped:
            s.dropped[reason] = s.dropped.get(reason, 0) + 1
        s.cut_rows += outcome.cut
        s.split_conversations += outcome.split
        s.spliced_turns += outcome.spliced
        s.reasoning_dropped_turns += outcome.reasoning_dropped
        s.unmasked_turns += outcome.unmasked
        s.prompt_checks += outcome.checks
        s.prompt_mismatches += len(outcome.mismatches)
        room = _EXAMPLES - len(s.mismatch_examples)
        s.mismatch_examples.extend(outcome.mismatches[: max(room, 0)])
        return outcome.rows

    def drain(
        self,
        chunks: Iterator[tuple[int, list[Outcome]]],
        sink: DatasetSink,
        progress: Any,
        task: Any,
    ) -> None:
        """Write every chunk's rows to the dataset and the conversations file, counting them."""
        s = self.stats
        for done, outcomes in chunks:
            rows = [row for outcome in outcomes for row in self.merge(outcome)]
            for row in rows:
                s.tokens += len(row.input_ids)
                s.masked_tokens += int(row.loss_mask.sum())
                s.flagged_truncated += row.truncated and self.flag
            s.rows_out += len(rows)
            self.conversations.writelines(row.conversation + "\n" for row in rows)
            sink.write(rows)
            progress.update(task, completed=done, rows=s.rows_out)


def load_tokenizer(tokenizer: Any) -> Any:
    """Return a fast tokenizer: the object given, or loaded from a local path or hub id."""
    if isinstance(tokenizer, str | Path):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("a fast tokenizer (tokenizer.json) is needed for character offsets")
    return tokenizer


def template_source(tokenizer: Any, chat_template: str | Path | None) -> tuple[str, str]:
    """Return (template text, name for messages) from a file, template text or the tokenizer."""
    if chat_template is not None:
        text = str(chat_template)
        if "{%" in text or "{{" in text:
            return text, "given template"
        path = Path(chat_template)
        return path.read_text(encoding="utf-8"), path.name
    found = getattr(tokenizer, "chat_template", None)
    if isinstance(found, dict):  # several named templates: the default one is what servers use
        found = found.get("default")
    if not isinstance(found, str) or not found:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template: pass --chat-template"
        )
    return found, f"{tokenizer.name_or_path} chat template"


def _target_vocab_size(tokenizer: Any) -> int:
    """Return the model's vocab size from a local config.json, else the tokenizer's length."""
    config = Path(str(getattr(tokenizer, "name_or_path", ""))) / "config.json"
    try:
        size = json.loads(config.read_text()).get("vocab_size")
    except (OSError, ValueError):
        size = None
    return int(size) if isinstance(size, int) else len(tokenizer)


def _clear_output(target: Path) -> None:
    """Remove a previous (or half-written) dataset at target; refuse to delete anything else."""
    if not target.exists():
        return
    ours = ("state.json", "dataset_info.json", "data-*.arrow", ".shard-*.arrow")
    strangers = [p for p in target.iterdir() if not any(p.match(g) for g in ours)]
    if strangers or not target.is_dir():
        raise ValueError(f"{target} exists and is not a dataset this job wrote; not overwriting it")
    shutil.rmtree(target)


def _check_options(
    max_length: int | None, num_proc: int, on_length: str, truncate: str, per_turn: str
) -> None:
    """Raise ValueError for an option out of range."""
    if max_length is not None and max_length < 1:
        raise ValueError("max_length must be positive")
    if num_proc < 1:
        raise ValueError("num_proc must be at least 1")
    if on_length not in ("keep", "drop", "flag"):
        raise ValueError("on_length must be keep, drop or flag")
    if truncate not in ("drop", "turn"):
        raise ValueError("truncate must be drop or turn")
    if per_turn not in ("auto", "always", "never"):
        raise ValueError("per_turn must be auto, always or never")


def tokenize(
    in_path: str | Path,
    tokenizer: Any,
    out_dir: str | Path,
    chat_template: str | Path | None = None,
    max_length: int | None = None,
    num_proc: int = 1,
    on_length: FinishPolicy = "keep",
    truncate: TruncatePolicy = "drop",
    per_turn: PerTurn = "auto",
    *,
    progress: bool = True,
    console: Console | None = None,
    chunk_lines: int = 256,
) -> TokenizeStats:
    """Turn collector JSONL into a training dataset, SpecForge JSONL and stats (see module doc)."""
    from rich.console import Console

    _check_options(max_length, num_proc, on_length, truncate, per_turn)
    console = console or Console()
    in_path, out_dir = Path(in_path), Path(out_dir)
    if not in_path.is_file():
        raise FileNotFoundError(f"input not found: {in_path}")
    tok = load_tokenizer(tokenizer)
    text, name = template_source(tok, chat_template)
    specials = tuple(str(t) for t in tok.get_added_vocab())
    cfg = JobConfig(
        text,
        name,
        dict(tok.special_tokens_map),
        specials,
        max_length,
        on_length,
        truncate,
        per_turn,
    )
    options: dict[str, Any] = {"max_length": max_length, "num_proc": num_proc}
    options["on_length"] = on_length
    options |= {"truncate": truncate, "per_turn": per_turn, "chat_template": name}
    stats = TokenizeStats(
        str(in_path),
        str(out_dir),
        str(tok.name_or_path),
        len(tok),
        _target_vocab_size(tok),
        name,
        options,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear_output(out_dir / "dataset")
    started = time.monotonic()
    chunks = _outcomes(in_path, tok.backend_tokenizer, cfg, num_proc, chunk_lines)
    flag = on_length == "flag"
    with (
        (out_dir / "conversations.jsonl").open("w", encoding="utf-8") as conv,
        DatasetSink(out_dir / "dataset", flag) as sink,
        _progress(console, progress) as bar,
    ):
        task = bar.add_task("tokenize", total=in_path.stat().st_size, rows=0)
        _Collector(stats, conv, flag).drain(chunks, sink, bar, task)
    stats.seconds = round(time.monotonic() - started, 3)
    (out_dir / "stats.json").write_text(json.dumps(stats.to_dict(), indent=2) + "\n")
    print_stats(stats, console)
    return stats


def _progress(console: Console, enabled: bool) -> Any:
    """Return a rich progress bar over input bytes, with a rows-written counter."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[rows]} rows"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


def print_stats(stats: TokenizeStats, console: Console) -> None:
    """Print the stats table, then warnings for bad rows and prompt-token mismatches."""
    from rich.table import Table

    table = Table(title="eaglegen tokenize", show_header=False)
    for label, value in _stat_lines(stats):
        table.add_row(label, value)
    console.print(table)
    if stats.bad_rows:
        where = ", ".join(f"line {b['line']}: {b['reason']}" for b in stats.bad_examples[:3])
        console.print(f"[yellow]warning:[/] {stats.bad_rows} bad rows skipped ({where})")
    if stats.reasoning_dropped_turns:
        console.print(
            f"[yellow]warning:[/] {stats.reasoning_dropped_turns} turns carry reasoning the chat "
            "template does not render; those rows hold the answers without it"
        )
    if stats.prompt_mismatches:
        ids = ", ".join(f"{m['id']} (turn {m['turn']})" for m in stats.mismatch_examples)
        console.print(
            f"[yellow]warning:[/] {stats.prompt_mismatches} of {stats.prompt_checks} turns have a "
            f"prompt token count unlike the server's, e.g. {ids}: the chat template probably "
            "differs from the one used for generation"
        )


def _stat_lines(s: TokenizeStats) -> list[tuple[str, str]]:
    """Return the (label, value) lines of the stats table."""
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(s.dropped.items())) or "0"
    share = f" ({s.masked_tokens / s.tokens:.1%})" if s.tokens else ""
    return [
        ("lines read", str(s.lines)),
        ("records", str(s.records)),
        ("bad rows", str(s.bad_rows)),
        ("duplicate ids skipped", str(s.duplicates)),
        ("rows out", str(s.rows_out)),
        ("tokens", str(s.tokens)),
        ("masked tokens", f"{s.masked_tokens}{share}"),
        ("rows dropped", dropped),
        ("rows cut at a turn", str(s.cut_rows)),
        ("rows flagged truncated", str(s.flagged_truncated)),
        ("conversations split per turn", str(s.split_conversations)),
        ("turns spliced (reasoning)", str(s.spliced_turns)),
        ("turns whose reasoning the template drops", str(s.reasoning_dropped_turns)),
        ("turns not trained (history rewritten)", str(s.unmasked_turns)),
        ("prompt-token mismatches", f"{s.prompt_mismatches} of {s.prompt_checks}"),
        ("seconds", f"{s.seconds:.1f}"),
    ]
