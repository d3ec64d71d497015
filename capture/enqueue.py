"""``eaglegen capture enqueue``: one task per row of a tokenized dataset, once per run.

Row ids are the dataset's row indices, so enqueueing again adds nothing; the dataset's
content fingerprint is part of the run, so a changed dataset under the same run is refused
before anything is queued. The bytes the new rows will take are estimated from the model's
config and checked against the output filesystem's free space.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capture.identity import ModelIdentity
from capture.layers import plan
from capture.manifest import MANIFEST
from capture.model_config import ModelShape
from capture.rows import fingerprint, first_out_of_vocab, row_lengths
from capture.spec import CaptureSpec, Layout, RowRef
from capture.store import CaptureStore
from common.errors import ConfigError

MARKER = ".eaglegen-capture.json"  # OUT_DIR belongs to this run


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue did."""

    rows: int
    new: int
    present: int
    estimate_bytes: int
    free_bytes: int


def model_of(tokenized_dir: Path, model: Path | None) -> Path:
    """The target: ``--model``, else the tokenizer folder ``eaglegen tokenize`` used."""
    if model is not None:
        return model
    try:
        stats = json.loads((tokenized_dir / "stats.json").read_text())
    except (OSError, ValueError):
        stats = {}
    found = Path(str(stats.get("tokenizer", "")))
    if stats.get("tokenizer") and (found / "config.json").is_file():
        return found
    raise ConfigError(
        f"{tokenized_dir} names no target model: give --model MODEL_DIR (the run is pinned to "
        "it; its config.json sizes the disk estimate)"
    )


def check_rows(tokenized_dir: Path, lengths: list[int], shape: ModelShape) -> None:
    """Refuse, before anything is queued, rows the model cannot take: an id outside its
    vocabulary (the batched forward pass would fail every row with it; on CUDA, a device
    assert) or more tokens than its positions."""
    if shape.max_positions is not None:
        long = next((i for i, n in enumerate(lengths) if n > shape.max_positions), None)
        if long is not None:
            raise ConfigError(
                f"row {long} has {lengths[long]} tokens, more than the model's "
                f"max_position_embeddings ({shape.max_positions}): shorten or drop such rows"
            )
    if shape.vocab is not None and (bad := first_out_of_vocab(tokenized_dir, shape.vocab)):
        row, token = bad
        raise ConfigError(
            f"row {row} holds token id {token}, outside the model's vocab_size ({shape.vocab}): "
            "was the dataset tokenized with another tokenizer? Tokenize with the target's own"
        )


def claim_out_dir(out_dir: Path, run: str) -> None:
    """Make OUT_DIR this run's, or refuse one that holds anything else."""
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / MARKER
    if marker.is_file():
        owner = json.loads(marker.read_text()).get("run")
        if owner != run:
            raise ConfigError(
                f"{out_dir} holds capture run {owner!r}, not {run!r}: use another --out"
            )
        return
    strangers = [p.name for p in out_dir.iterdir() if p.name != MANIFEST]
    if strangers:
        raise ConfigError(
            f"{out_dir} is not empty and not a capture output ({', '.join(sorted(strangers)[:3])}"
            "...): nothing in it is overwritten; use an empty or new --out"
        )
    marker.write_text(json.dumps({"run": run}) + "\n")


def enqueue_rows(
    store: CaptureStore, publish: Any, tokenized_dir: Path, out_dir: Path, layout: Layout,
    aux: tuple[int, ...] | None, shape: ModelShape, queue: str, force: bool = False,
    model: ModelIdentity | None = None,
) -> Enqueued:  # fmt: skip
    """Check, record and queue the rows; ``publish(run, ids)`` sends the new ones."""
    tokenized_dir, out_dir = tokenized_dir.resolve(), out_dir.resolve()
    plan(layout, shape.layers, aux)  # refuse layers the model does not have, before anything
    lengths = row_lengths(tokenized_dir)
    check_rows(tokenized_dir, lengths, shape)
    spec = CaptureSpec(
        tokenized_dir=str(tokenized_dir), fingerprint=fingerprint(tokenized_dir),
        out_dir=str(out_dir), layout=layout, aux_layers=aux, rows=len(lengths), model=model,
    )  # fmt: skip
    existing = store.spec()
    if existing is not None and existing.fingerprint != spec.fingerprint:
        store.ensure_spec(spec, queue)  # raises the mismatch
    known = store.runs.known([str(i) for i in range(len(lengths))])
    fresh_tokens = sum(n for n, seen in zip(lengths, known, strict=True) if not seen)
    estimate = shape.bytes_for(fresh_tokens)
    claim_out_dir(out_dir, store.run)
    free = shutil.disk_usage(out_dir).free
    if estimate > free and not force:
        raise ConfigError(
            f"the new rows need about {estimate / 1e9:.2f} GB and {out_dir} has "
            f"{free / 1e9:.2f} GB free: free some space or pass --force"
        )
    store.ensure_spec(spec, queue)
    refs = [RowRef(row=i, tokens=n) for i, n in enumerate(lengths)]
    flags = store.accept(refs)
    new_ids = [str(r.row) for r, new in zip(refs, flags, strict=True) if new]
    if new_ids:
        publish(store.run, new_ids)
    return Enqueued(len(refs), len(new_ids), len(refs) - len(new_ids), estimate, free)
