"""Stream training rows into a ``datasets`` directory, in ``save_to_disk``'s layout.

``datasets`` stores a dataset as Arrow IPC stream files plus ``dataset_info.json`` and
``state.json``; ``load_from_disk`` reads that directory. Rows are written here one record batch
per chunk, built from numpy buffers: memory stays flat whatever the input size, and nothing is
written twice. (``Dataset.from_generator`` converts each example's Python lists element by
element, which cost a quarter of the whole job, then ``save_to_disk`` rewrites everything
through a memory map whose pages count in the process's RSS.) Shards roll over at
``shard_bytes``, like ``save_to_disk``'s default of 500 MB.
"""

from __future__ import annotations

import json
import uuid
from array import array
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

SHARD_BYTES = 500 * 2**20
# input_ids travel as array("i"): 4-byte ints, as the int32 column stores them.
assert array("i").itemsize == 4


@dataclass(slots=True)
class OutRow:
    """One output row (ids as int32 array, mask as int8 numpy), plus its SpecForge line."""

    id: str
    input_ids: array[int]
    loss_mask: Any
    truncated: bool
    conversation: str


def features(flag: bool) -> Any:
    """Return the dataset's column types (``truncated`` only when flagged)."""
    from datasets import Features, List, Value

    cols = {
        "id": Value("string"),
        "input_ids": List(Value("int32")),
        "loss_mask": List(Value("int8")),
    }
    if flag:
        cols["truncated"] = Value("bool")
    return Features(cols)


class TableSink:
    """Writes Arrow record batches as ``save_to_disk`` shards; ``close`` adds the metadata files.

    ``format_type`` is the format ``load_from_disk`` gives the dataset back in (``"torch"`` for
    speculators' trainer; None for plain Python values).
    """

    def __init__(
        self,
        target: Path,
        features: Any,
        shard_bytes: int | None = None,
        format_type: str | None = None,
    ) -> None:
        """Prepare to write into ``target`` (created; must not exist)."""
        self.target = target
        self.shard_bytes = shard_bytes or SHARD_BYTES
        self.features = features
        self.format_type = format_type
        self.schema = features.arrow_schema
        self.shards: list[Path] = []
        self.file: Any = None
        self.writer: Any = None
        target.mkdir(parents=True)

    def __enter__(self) -> Self:
        """Open the first shard."""
        self._open()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the shard; on success, name the shards and write the metadata."""
        self._close_shard()
        if kind is None:
            self._finish()

    def write_batch(self, batch: Any) -> None:
        """Append one record batch, starting a new shard when this one is full."""
        if self.file.tell() >= self.shard_bytes:
            self._close_shard()
            self._open()
        self.writer.write_batch(batch)

    def _open(self) -> None:
        """Start a new shard file (temporary name until the count is known)."""
        import pyarrow as pa

        path = self.target / f".shard-{len(self.shards):05d}.arrow"
        self.shards.append(path)
        self.file = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.file, self.schema)

    def _close_shard(self) -> None:
        """Finish the current shard's stream and close its file."""
        if self.writer is not None:
            self.writer.close()
            self.file.close()
            self.writer = self.file = None

    def _finish(self) -> None:
        """Rename shards as save_to_disk names them and write its two metadata files."""
        from datasets import DatasetInfo

        names = [f"data-{i:05d}-of-{len(self.shards):05d}.arrow" for i in range(len(self.shards))]
        for path, name in zip(self.shards, names, strict=True):
            path.rename(self.target / name)
        DatasetInfo(features=self.features).write_to_directory(str(self.target))
        state: dict[str, Any] = {
            "_data_files": [{"filename": name} for name in names],
            "_fingerprint": uuid.uuid4().hex,
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": self.format_type,
            "_output_all_columns": False,
            "_split": None,
        }
        (self.target / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))


class DatasetSink(TableSink):
    """Writes batches of OutRows (the tokenize job's rows) as ``save_to_disk`` shards."""

    def __init__(self, target: Path, flag: bool, shard_bytes: int | None = None) -> None:
        """Prepare to write into ``target``; ``flag`` adds the ``truncated`` column."""
        super().__init__(target, features(flag), shard_bytes)
        self.flag = flag

    def write(self, rows: list[OutRow]) -> None:
        """Append rows as one record batch."""
        if rows:
            self.write_batch(self._batch(rows))

    def _batch(self, rows: list[OutRow]) -> Any:
        """Build a record batch from the rows' buffers without touching single tokens."""
        import numpy as np
        import pyarrow as pa

        lengths = np.fromiter((len(r.input_ids) for r in rows), np.int64, len(rows))
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        ids = np.frombuffer(b"".join(r.input_ids for r in rows), dtype=np.int32)
        mask = np.concatenate([r.loss_mask for r in rows])
        cols = [
            pa.array([r.id for r in rows], pa.string()),
            pa.ListArray.from_arrays(offsets, pa.array(ids)),
            pa.ListArray.from_arrays(offsets, pa.array(mask)),
        ]
        if self.flag:
            cols.append(pa.array([r.truncated for r in rows], pa.bool_()))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)
