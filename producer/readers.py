"""Reading prompt sources row by row: local JSONL/JSON/Parquet files or Hugging Face datasets.

Local JSONL is read line by line here (not through ``datasets``) so that one broken line is a
counted, reported row instead of an exception that stops the whole file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import SourceError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class RawRow:
    """One source row: its 0-based index, and either its data or why it could not be read."""

    index: int
    data: dict[str, Any] | None
    error: str | None = None


@dataclass(frozen=True)
class SourceInfo:
    """How a source is named in records."""

    dataset: str
    split: str | None
    rows: int | None = None  # when cheap to know (local JSONL), for the progress bar


def open_source(
    source: str, split: str | None = None, subset: str | None = None
) -> tuple[SourceInfo, Iterator[RawRow]]:
    """Describe ``source`` and return an iterator over its rows."""
    path = Path(source)
    if path.is_file():
        if path.stat().st_size == 0:
            raise SourceError(f"{source}: empty file")
        lines = count_lines(path) if path.suffix.lower() == ".jsonl" else None
        return SourceInfo(path.name, split, lines), _read_file(path)
    if path.exists():
        raise SourceError(f"{source} is not a file")
    if _looks_like_path(source):
        raise SourceError(f"no such file: {source}")
    rows = _read_hub(source, split or "train", subset)
    return SourceInfo(source, split or "train"), rows


def _looks_like_path(source: str) -> bool:
    suffixes = (".jsonl", ".json", ".parquet", ".csv")
    return (
        source.startswith((".", "/", "~")) or source.endswith(suffixes) or not _HUB_ID.match(source)
    )


def count_lines(path: Path) -> int:
    """Lines in a file, counted in 1 MiB blocks (bytes, never decoded)."""
    count = 0
    last = b"\n"
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _read_file(path: Path) -> Iterator[RawRow]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json_array(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise SourceError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")


def _read_jsonl(path: Path) -> Iterator[RawRow]:
    with path.open("rb") as handle:
        for index, raw in enumerate(handle):
            yield _parse_line(index, raw)


def _parse_line(index: int, raw: bytes) -> RawRow:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RawRow(index, None, f"not UTF-8 ({exc.reason} at byte {exc.start})")
    if not text.strip():
        return RawRow(index, None, "empty line")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return RawRow(index, None, f"broken JSON ({exc.msg} at column {exc.colno})")
    if not isinstance(data, dict):
        return RawRow(index, None, f"a JSON {type(data).__name__}, not an object")
    return RawRow(index, data)


def _read_json_array(path: Path) -> Iterator[RawRow]:
    raw = path.read_bytes()
    if not raw.strip():
        raise SourceError(f"{path}: empty file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    if not isinstance(data, list):
        raise SourceError(f"{path}: a .json source must be an array of rows, not a JSON object")
    return (
        RawRow(i, row) if isinstance(row, dict) else RawRow(i, None, "row is not an object")
        for i, row in enumerate(data)
    )


def _read_parquet(path: Path) -> Iterator[RawRow]:
    import datasets

    try:
        table = datasets.load_dataset(
            "parquet", data_files=str(path), split="train", streaming=True
        )
    except Exception as exc:  # datasets raises many types; any means the file is unusable
        raise SourceError(f"{path}: cannot read parquet ({_first_line(exc)})") from exc
    return _iter_table(table, str(path))


def _read_hub(name: str, split: str, subset: str | None) -> Iterator[RawRow]:
    import datasets

    try:
        table = datasets.load_dataset(name, subset, split=split, streaming=True)
    except Exception as exc:  # network, missing dataset, bad split: all end the command
        raise SourceError(f"cannot open dataset {name!r}: {_first_line(exc)}") from exc
    return _iter_table(table, name)


def _iter_table(table: Any, name: str) -> Iterator[RawRow]:
    # Streaming datasets fail lazily (network, corrupt shard): turn that into one clear error.
    rows = iter(table)
    index = 0
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as exc:
            raise SourceError(
                f"{name}: reading failed at row {index + 1}: {_first_line(exc)}"
            ) from exc
        yield RawRow(index, dict(row))
        index += 1


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
