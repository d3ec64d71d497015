"""The EAGLE-3 draft vocabulary (d2t / t2d) from a tokenized dataset.

Same algorithm as SpecForge, speculators and EAGLE: count the token ids where ``loss_mask == 1``;
keep the top ``draft_vocab_size`` by (-count, id); if fewer ids were used, pad with the smallest
unused ids; sort ascending. ``d2t[i] = used[i] - i`` (target id = draft id + d2t[draft id]),
int64; ``t2d`` is a bool mask over the target vocabulary. Saved as
``torch.save({"d2t": d2t, "t2d": t2d})``, the layout SpecForge's ``load_vocab_mapping`` reads
(``vocab_mapping["d2t"]``, ``vocab_mapping["t2d"]``).

A JSON sidecar (``<out>.json``) records the data fingerprint (sha256 over the dataset's
``input_ids``, ``loss_mask`` and row lengths, independent of sharding), both sizes and the
mapping file's own hash. An existing mapping is kept only when all of those match; otherwise it
is recomputed and overwritten, never reused for changed data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]

_BATCH = 4096


@dataclass(frozen=True)
class VocabMapResult:
    """What vocab_map did: where, for which data, and whether it (re)wrote the file."""

    out_file: str
    sidecar: str
    status: str
    fingerprint: str
    draft_vocab_size: int
    target_vocab_size: int
    masked_tokens: int
    distinct_ids: int
    padded: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-ready dict."""
        return asdict(self)


def select_draft_ids(counts: IntArray, draft_vocab_size: int) -> IntArray:
    """Return the sorted target ids of the draft vocab: top by (-count, id), padded if short."""
    import numpy as np

    if draft_vocab_size > len(counts):
        raise ValueError(
            f"draft vocab size {draft_vocab_size} exceeds the target vocab size {len(counts)}"
        )
    used = np.flatnonzero(counts)
    order = np.lexsort((used, -counts[used]))  # last key is primary: -count, then id
    top = used[order[:draft_vocab_size]]
    if len(top) < draft_vocab_size:
        free = np.ones(len(counts), dtype=bool)
        free[top] = False
        top = np.concatenate([top, np.flatnonzero(free)[: draft_vocab_size - len(top)]])
    return np.sort(top).astype(np.int64)


def build_mapping(
    counts: IntArray, draft_vocab_size: int
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Return (d2t, t2d) as numpy arrays for the given per-id counts."""
    import numpy as np

    used = select_draft_ids(counts, draft_vocab_size)
    d2t = used - np.arange(len(used), dtype=np.int64)
    t2d = np.zeros(len(counts), dtype=bool)
    t2d[used] = True
    return d2t, t2d


def dataset_paths(path: str | Path) -> tuple[Path, Path | None]:
    """Return (dataset dir, stats.json or None) for a tokenize output dir or its dataset dir."""
    path = Path(path)
    for data, stats in (
        (path / "dataset", path / "stats.json"),
        (path, path.parent / "stats.json"),
    ):
        if (data / "state.json").exists():
            return data, stats if stats.exists() else None
    raise FileNotFoundError(f"no saved dataset at {path} (expected {path}/dataset/state.json)")


def count_masked(dataset_dir: Path) -> tuple[IntArray, str, int]:
    """Return (counts per id under the loss mask, data fingerprint, masked tokens)."""
    import numpy as np
    import pyarrow.compute as pc
    from datasets import load_from_disk

    ds = load_from_disk(str(dataset_dir))
    hashes = {k: hashlib.sha256() for k in ("lengths", "ids", "mask")}
    counts = np.zeros(0, dtype=np.int64)
    for table in ds.with_format("arrow").iter(batch_size=_BATCH):
        ids_col, mask_col = table.column("input_ids"), table.column("loss_mask")
        ids = pc.list_flatten(ids_col).to_numpy(zero_copy_only=False).astype(np.int64)
        mask = pc.list_flatten(mask_col).to_numpy(zero_copy_only=False).astype(np.uint8)
        lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False).astype(np.int64)
        if ids.size and ids.min() < 0:
            raise ValueError(f"{dataset_dir} holds a negative token id")
        hashes["lengths"].update(lengths.astype("<i8").tobytes())
        hashes["ids"].update(ids.astype("<i8").tobytes())
        hashes["mask"].update(mask.tobytes())
        batch = np.bincount(ids[mask.astype(bool)])
        if len(batch) > len(counts):
            counts = np.pad(counts, (0, len(batch) - len(counts)))
        counts[: len(batch)] += batch
    digest = hashlib.sha256(b"".join(h.digest() for h in hashes.values())).hexdigest()
    return counts, digest, int(counts.sum())


def _target_size(stats: Path | None, given: int | None) -> int:
    """Return the target vocab size: given, else from stats.json, else an error."""
    if given is not None:
        return given
    if stats is not None:
        size = json.loads(stats.read_text()).get("target_vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    raise ValueError(
        "target vocab size unknown: pass --target-vocab-size (the model config's vocab_size)"
    )


def _file_sha(path: Path) -> str:
    """Return the sha256 of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _previous(out: Path, sidecar: Path) -> dict[str, Any] | None:
    """Return the sidecar of an existing mapping, or None if either file is missing or bad."""
    if not out.exists() or not sidecar.exists():
        return None
    try:
        meta = json.loads(sidecar.read_text())
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def vocab_map(
    dataset_dir: str | Path,
    draft_vocab_size: int,
    out_file: str | Path,
    target_vocab_size: int | None = None,
) -> VocabMapResult:
    """Compute the draft vocab mapping of a tokenized dataset and save it (see module doc)."""
    if draft_vocab_size < 1:
        raise ValueError("draft vocab size must be positive")
    data, stats = dataset_paths(dataset_dir)
    vocab = _target_size(stats, target_vocab_size)
    counts, fingerprint, masked = count_masked(data)
    if len(counts) > vocab:
        raise ValueError(f"token id {len(counts) - 1} is outside the target vocab size {vocab}")
    counts = _pad(counts, vocab)
    out = Path(out_file)
    sidecar = out.with_name(out.name + ".json")
    meta = {
        "fingerprint": fingerprint,
        "draft_vocab_size": draft_vocab_size,
        "target_vocab_size": vocab,
        "dataset": str(data),
        "masked_tokens": masked,
        "distinct_ids": int((counts > 0).sum()),
        "layout": "torch.save({'d2t': int64[draft], 't2d': bool[target]})",
    }
    padded = max(draft_vocab_size - int((counts > 0).sum()), 0)
    previous = _previous(out, sidecar)
    same = previous is not None and all(previous.get(k) == meta[k] for k in _KEYS)
    if same and previous is not None and previous.get("file_sha256") == _file_sha(out):
        return _result(out, sidecar, "unchanged", meta, padded, "mapping is up to date")
    _save(counts, draft_vocab_size, out)
    meta["file_sha256"] = _file_sha(out)
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    if previous is None:
        return _result(out, sidecar, "written", meta, padded, "mapping written")
    old = str(previous.get("fingerprint", "?"))[:12]
    note = f"existing mapping was for other data or sizes ({old}…): recomputed and overwritten"
    return _result(out, sidecar, "overwritten", meta, padded, note)


_KEYS = ("fingerprint", "draft_vocab_size", "target_vocab_size")


def _pad(counts: IntArray, size: int) -> IntArray:
    """Return counts extended with zeros to ``size`` entries."""
    import numpy as np

    return np.pad(counts, (0, size - len(counts))) if len(counts) < size else counts


def _save(counts: IntArray, draft_vocab_size: int, out: Path) -> None:
    """Build d2t/t2d and torch.save them to out (atomically: write then rename)."""
    import torch

    d2t, t2d = build_mapping(counts, draft_vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, tmp)
    tmp.replace(out)


def _result(
    out: Path, sidecar: Path, status: str, meta: dict[str, Any], padded: int, message: str
) -> VocabMapResult:
    """Build the VocabMapResult from the sidecar fields."""
    return VocabMapResult(
        str(out),
        str(sidecar),
        status,
        meta["fingerprint"],
        meta["draft_vocab_size"],
        meta["target_vocab_size"],
        meta["masked_tokens"],
        meta["distinct_ids"],
        padded,
        message,
    )
