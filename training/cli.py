"""``eaglegen tokenize``, ``vocab-map`` and ``export``: registered on the main Typer app.

The heavy imports (transformers, torch, datasets) happen inside the commands, so the rest of
the CLI works without the ``train`` extra; a missing extra gives a one-line error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

_EXTRA = "install the train extra: pip install -e '.[train]'"


def _require(*modules: str) -> None:
    """Exit with the one-line install hint if any module of the train extra is missing."""
    if any(importlib.util.find_spec(m) is None for m in modules):
        typer.echo(f"error: {_EXTRA}", err=True)
        raise typer.Exit(1)


def _fail(exc: Exception) -> typer.Exit:
    """Print a one-line error for an expected failure and return the exit to raise."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


def tokenize_command(
    input_path: Annotated[Path, typer.Argument(help="Collector JSONL (or SpecForge rows).")],
    tokenizer: Annotated[str, typer.Option(help="Target model's tokenizer: path or hub id.")],
    out: Annotated[Path, typer.Option(help="Output directory.")],
    chat_template: Annotated[
        Path | None, typer.Option(help="Jinja chat template file (default: the tokenizer's).")
    ] = None,
    max_length: Annotated[int | None, typer.Option(help="Longest row, in tokens.")] = None,
    num_proc: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    finish_length: Annotated[
        str, typer.Option(help="Turns cut by max_tokens: keep, drop or flag.")
    ] = "keep",
    truncate: Annotated[
        str, typer.Option(help="Rows over --max-length: drop, or cut at a turn.")
    ] = "drop",
    per_turn: Annotated[
        str, typer.Option(help="One row per assistant turn: auto, always or never.")
    ] = "auto",
    source: Annotated[
        str,
        typer.Option(
            help="Rows from the server's token ids where records have them (auto), only from "
            "ids (ids), or from the chat template (template)."
        ),
    ] = "auto",
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Tokenize conversations with the target's chat template into EAGLE-3 training rows."""
    _require("transformers", "tokenizers", "jinja2")
    from training.render import TemplateError
    from training.tokenize import tokenize

    try:
        tokenize(
            input_path,
            tokenizer,
            out,
            chat_template=chat_template,
            max_length=max_length,
            num_proc=num_proc,
            on_length=finish_length,  # type: ignore[arg-type]  # checked by tokenize()
            truncate=truncate,  # type: ignore[arg-type]
            per_turn=per_turn,  # type: ignore[arg-type]
            source=source,  # type: ignore[arg-type]
            progress=progress,
        )
    except (TemplateError, ValueError, OSError) as exc:
        raise _fail(exc) from None


def vocab_map_command(
    dataset: Annotated[Path, typer.Argument(help="Output directory of `eaglegen tokenize`.")],
    draft_vocab_size: Annotated[int, typer.Option(help="Draft vocabulary size, e.g. 32000.")],
    out: Annotated[Path, typer.Option(help="Mapping file to write (torch.save).")],
    target_vocab_size: Annotated[
        int | None, typer.Option(help="Target vocab size (default: from stats.json).")
    ] = None,
) -> None:
    """Build the EAGLE-3 draft vocabulary mapping (d2t, t2d) from a tokenized dataset."""
    _require("torch", "datasets")
    from training.vocab import vocab_map

    try:
        result = vocab_map(dataset, draft_vocab_size, out, target_vocab_size)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(
        f"{result.message}: {result.out_file} (draft {result.draft_vocab_size}, target "
        f"{result.target_vocab_size}, {result.distinct_ids} ids used, {result.padded} padded, "
        f"data {result.fingerprint[:12]})"
    )


def export_command(
    tokenized: Annotated[Path, typer.Argument(help="Output directory of `eaglegen tokenize`.")],
    out: Annotated[Path, typer.Option(help="Directory to write the trainers' files into.")],
    trainer: Annotated[
        list[str] | None, typer.Option(help="specforge and/or speculators (default: both).")
    ] = None,
    draft_vocab_size: Annotated[
        int | None, typer.Option(help="Also write the draft vocabulary mapping, e.g. 32000.")
    ] = None,
    target_vocab_size: Annotated[
        int | None, typer.Option(help="Target vocab size (default: from stats.json).")
    ] = None,
) -> None:
    """Write what SpecForge and speculators read: JSONL rows, their dataset, vocab files."""
    _require("torch", "datasets")
    from training.export import TRAINERS, export

    chosen = tuple(trainer or TRAINERS)
    try:
        result = export(tokenized, out, chosen, draft_vocab_size, target_vocab_size)  # type: ignore[arg-type]  # checked by export()
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(f"exported {result.rows} rows to {result.out}:")
    for name in result.files:
        typer.echo(f"  {name}")


def register(app: typer.Typer) -> None:
    """Add the ``tokenize``, ``vocab-map`` and ``export`` commands to the main app."""
    app.command("tokenize")(tokenize_command)
    app.command("vocab-map")(vocab_map_command)
    app.command("export")(export_command)
