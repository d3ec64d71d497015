"""Reading ``eaglegen tokenize`` output: the dataset's rows and a fingerprint of its content."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

DATASET = "dataset"


@dataclass(frozen=True)
class Row:
    """One tokenized row: its index, its own id, its ids and mask."""

    index: int
    sample: str
    input_ids: list[int]
    loss_mask: list[int]


def dataset_dir(tokenized_dir: Path) -> Path:
    """The ``load_from_disk`` folder inside ``eaglegen tokenize``'s output."""
    found = tokenized_dir / DATASET
    if not (found / "state.json").is_file():
        raise ConfigError(
            f"{tokenized_dir} is not `eaglegen tokenize` output (no {DATASET}/state.json)"
        )
    return found


def fingerprint(tokenized_dir: Path) -> str:
    """SHA-256 over the dataset's data files, in order: equal content, equal fingerprint
    (``state.json``'s own fingerprint is random on every write)."""
    folder = dataset_dir(tokenized_dir)
    state = json.loads((folder / "state.json").read_text())
    digest = hashlib.sha256()
    for entry in state.get("_data_files", []):
        name = str(entry["filename"])
        digest.update(name.encode() + b"\0")
        with (folder / name).open("rb") as fh:
            while piece := fh.read(1 << 20):
                digest.update(piece)
    return digest.hexdigest()


class Rows:
    """A tokenized dataset, memory-mapped, read a row at a time (thread-safe)."""

    def __init__(self, tokenized_dir: Path) -> None:
        from datasets import load_from_disk

        self._ds: Any = load_from_disk(str(dataset_dir(tokenized_dir)))
        self._ds.reset_format()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, index: int) -> Row:
        with self._lock:
            item = self._ds[index]
        return Row(index, str(item["id"]), list(item["input_ids"]), list(item["loss_mask"]))


def row_lengths(tokenized_dir: Path) -> list[int]:
    """Tokens of every row, read with pyarrow alone (no ``datasets``, no torch: enqueue)."""
    import pyarrow.compute as pc

    lengths: list[int] = []
    for ids in _id_columns(tokenized_dir):
        lengths += [int(n) for n in pc.list_value_length(ids).to_pylist()]
    return lengths


def first_out_of_vocab(tokenized_dir: Path, vocab: int) -> tuple[int, int] | None:
    """(row, id) of the first row holding an id outside ``[0, vocab)``; None: every id fits."""
    import pyarrow.compute as pc

    offset = 0
    for ids in _id_columns(tokenized_dir):
        flat = pc.list_flatten(ids)
        bad = pc.indices_nonzero(pc.or_(pc.less(flat, 0), pc.greater_equal(flat, vocab)))
        if len(bad):
            at = bad[0].as_py()
            return offset + int(pc.list_parent_indices(ids)[at].as_py()), int(flat[at].as_py())
        offset += len(ids)
    return None


def _id_columns(tokenized_dir: Path) -> Iterator[Any]:
    import pyarrow as pa

    folder = dataset_dir(tokenized_dir)
    state = json.loads((folder / "state.json").read_text())
    for entry in state.get("_data_files", []):
        with pa.memory_map(str(folder / str(entry["filename"]))) as source:
            # Chunk by chunk: list_parent_indices counts rows within its own array.
            yield from pa.ipc.open_stream(source).read_all().column("input_ids").chunks
