"""Export a tokenized dataset in the files each trainer's entry point reads, as they are.

From the output directory of ``eaglegen tokenize`` (``dataset/``, ``conversations.jsonl``,
``stats.json``), into ``out``:

- ``specforge/train.jsonl``: the rows pre-tokenized (``id``, ``input_ids``, ``loss_mask``),
  which SpecForge's ``prepare_prompt_tasks`` takes as they are. Its trainer reads JSON or JSONL
  only: a dataset folder fails with ``IsADirectoryError``.
- ``specforge/conversations.jsonl``: SpecForge's conversations route, one row per training row
  (history as the server saw it), with ``status``, ``finish_reason`` and the record's chat
  template kwargs (see :func:`training.records.specforge_row`).
- ``specforge/vocab_mapping.pt`` (with a draft vocab size): ``torch.save({"d2t", "t2d"})``,
  what SpecForge's ``load_vocab_mapping`` reads; built by :func:`training.vocab.vocab_map`.
- ``speculators/data/``: a ``load_from_disk`` dataset in the layout speculators' ``prepare-data``
  writes and its trainer reads (``input_ids`` and ``loss_mask`` int64, ``seq_len``, torch
  format), with ``d2t-<N>.npy`` / ``t2d-<N>.npy``, the names its trainer looks for in the data
  directory (a ``.pt`` fails there: "expected np.ndarray").
- ``speculators/conversations.jsonl``: speculators' conversations route (``prepare-data
  --data``), one row per conversation: its preprocessing makes one row per assistant turn.

Row order is the tokenize job's, in every file. Nothing is re-tokenized: the pre-tokenized
files hold exactly EagleGen's rows.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from training.sink import TableSink
from training.vocab import dataset_paths, vocab_map

Trainer = Literal["specforge", "speculators"]
TRAINERS: tuple[Trainer, ...] = ("specforge", "speculators")
_BATCH = 4096


@dataclass
class ExportResult:
    """What was written where, and how many rows."""

    out: str
    rows: int
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-ready dict."""
        return asdict(self)


def export(
    tokenized: str | Path,
    out: str | Path,
    trainers: tuple[Trainer, ...] = TRAINERS,
    draft_vocab_size: int | None = None,
    target_vocab_size: int | None = None,
) -> ExportResult:
    """Write each trainer's files from a tokenize output directory (see module doc)."""
    unknown = set(trainers) - set(TRAINERS)
    if unknown or not trainers:
        raise ValueError(f"trainers must be among {', '.join(TRAINERS)}")
    data, _ = dataset_paths(tokenized)
    conversations = data.parent / "conversations.jsonl"
    if not conversations.is_file():
        raise FileNotFoundError(f"no conversations.jsonl next to {data}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = ExportResult(str(out), 0)
    mapping = None
    if draft_vocab_size is not None:
        mapping = out / "specforge" / "vocab_mapping.pt"
        vocab_map(data, draft_vocab_size, mapping, target_vocab_size)
    if "specforge" in trainers:
        result.rows = _specforge_rows(data, out / "specforge" / "train.jsonl")
        shutil.copyfile(conversations, out / "specforge" / "conversations.jsonl")
        result.files += [str(out / "specforge" / n) for n in ("train.jsonl", "conversations.jsonl")]
        if mapping is not None:
            result.files.append(str(mapping))
    if "speculators" in trainers:
        result.rows = _speculators_dataset(data, out / "speculators" / "data")
        _whole_conversations(conversations, out / "speculators" / "conversations.jsonl")
        result.files += [str(out / "speculators" / n) for n in ("data", "conversations.jsonl")]
        if mapping is not None and draft_vocab_size is not None:
            result.files += _npy_mapping(mapping, out / "speculators" / "data", draft_vocab_size)
    return result


def _tables(data: Path) -> Iterator[Any]:
    """Yield the tokenized dataset as Arrow tables of a few thousand rows."""
    from datasets import load_from_disk

    yield from load_from_disk(str(data)).with_format("arrow").iter(batch_size=_BATCH)


def _specforge_rows(data: Path, target: Path) -> int:
    """Write ``{"id", "input_ids", "loss_mask"}`` JSON lines; return the row count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for table in _tables(data):
            cols = table.select(["id", "input_ids", "loss_mask"]).to_pydict()
            for rid, ids, mask in zip(
                cols["id"], cols["input_ids"], cols["loss_mask"], strict=True
            ):
                fh.write(json.dumps({"id": rid, "input_ids": ids, "loss_mask": mask}) + "\n")
            rows += table.num_rows
    tmp.replace(target)
    return rows


def speculators_features() -> Any:
    """Return the columns speculators' ``prepare-data`` writes for text rows."""
    from datasets import Features, List, Value

    return Features(
        {
            "input_ids": List(Value("int64")),
            "loss_mask": List(Value("int64")),
            "seq_len": Value("int64"),
        }
    )


def _speculators_dataset(data: Path, target: Path) -> int:
    """Write the speculators dataset (torch format) at target; return the row count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if target.exists():
        shutil.rmtree(target)
    features = speculators_features()
    rows = 0
    with TableSink(target, features, format_type="torch") as sink:
        for table in _tables(data):
            ids = table.column("input_ids").combine_chunks()
            cols = [
                ids.cast(pa.list_(pa.int64())),
                table.column("loss_mask").combine_chunks().cast(pa.list_(pa.int64())),
                pc.list_value_length(ids).cast(pa.int64()),
            ]
            sink.write_batch(pa.RecordBatch.from_arrays(cols, schema=sink.schema))
            rows += table.num_rows
    return rows


def _whole_conversations(source: Path, target: Path) -> None:
    """Keep each conversation's last row: the rows of one record are consecutive, and each
    one's history is a prefix of the next one's."""
    target.parent.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] | None = None
    with source.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as dst:
        for line in src:
            row = json.loads(line)
            if previous is not None and not _continues(previous, row):
                dst.write(json.dumps(previous, ensure_ascii=False) + "\n")
            previous = row
        if previous is not None:
            dst.write(json.dumps(previous, ensure_ascii=False) + "\n")


def _continues(row: dict[str, Any], later: dict[str, Any]) -> bool:
    """Return whether ``later`` is the same conversation carried further."""
    turns, more = row["conversations"], later["conversations"]
    return len(more) > len(turns) and more[: len(turns)] == turns


def _npy_mapping(mapping: Path, target: Path, size: int) -> list[str]:
    """Save the .pt mapping's d2t and t2d as the .npy files speculators reads."""
    import numpy as np
    import torch

    saved = torch.load(mapping, weights_only=True)
    names = []
    for key in ("d2t", "t2d"):
        path = target / f"{key}-{size}.npy"
        np.save(path, saved[key].numpy())
        names.append(str(path))
    return names
