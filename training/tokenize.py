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

Rows from token ids (``source``): where a record keeps the server's own ids of every turn
(``generation.turns[i].prompt_token_ids`` and ``token_ids``), a row is those ids, trained on the
completion ids (:mod:`training.id_rows`); ``auto`` uses them where present and the template
elsewhere, ``ids`` skips records without them (as bad rows), ``template`` ignores them. The
template is rendered for every record anyway: rows from ids that differ from the template's
are counted (``drift_rows`` of ``drift_checks``) and the first differing position is shown
decoded on both sides (``drift_examples``), a sign that training would otherwise have used
sequences the server never saw.

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

The parts: :mod:`training.chat_template` (finding and compiling the template),
:mod:`training.rows` (one chunk of lines to rows), :mod:`training.parallel` (running row
builders in order, in-process or in a pool), :mod:`training.writer` (merging outcomes into the
stats, writing rows), :mod:`training.stats` (the stats and their table); this module wires them.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.chat_template import template_source
from training.parallel import outcomes
from training.render import PerTurn
from training.rows import FinishPolicy, JobConfig, Source, TruncatePolicy
from training.sink import DatasetSink
from training.stats import TokenizeStats, print_stats
from training.writer import RowWriter

if TYPE_CHECKING:
    from rich.console import Console


def load_tokenizer(tokenizer: Any) -> Any:
    """Return a fast tokenizer: the object given, or loaded from a local path or hub id."""
    if isinstance(tokenizer, str | Path):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("a fast tokenizer (tokenizer.json) is needed for character offsets")
    return tokenizer


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
    max_length: int | None, num_proc: int, on_length: str, truncate: str, per_turn: str,
    source: str,
) -> None:  # fmt: skip
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
    if source not in ("auto", "ids", "template"):
        raise ValueError("source must be auto, ids or template")


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
    source: Source = "auto",
    *,
    progress: bool = True,
    console: Console | None = None,
    chunk_lines: int = 256,
) -> TokenizeStats:
    """Turn collector JSONL into a training dataset, SpecForge JSONL and stats (see module doc)."""
    from rich.console import Console

    _check_options(max_length, num_proc, on_length, truncate, per_turn, source)
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
        source,
    )
    options: dict[str, Any] = {"max_length": max_length, "num_proc": num_proc}
    options["on_length"] = on_length
    options |= {"truncate": truncate, "per_turn": per_turn, "chat_template": name}
    options["source"] = source
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
    chunks = outcomes(in_path, tok.backend_tokenizer, cfg, num_proc, chunk_lines)
    flag = on_length == "flag"
    with (
        (out_dir / "conversations.jsonl").open("w", encoding="utf-8") as conv,
        DatasetSink(out_dir / "dataset", flag) as sink,
        _progress(console, progress) as bar,
    ):
        task = bar.add_task("tokenize", total=in_path.stat().st_size, rows=0)
        RowWriter(stats, conv, flag).drain(chunks, sink, bar, task)
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
