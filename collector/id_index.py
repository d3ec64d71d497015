"""``<out>.ids``: the ids of the JSONL file's lines, so a restart reads only the new lines.

Append-only, kept in step with the JSONL: after each fsynced batch of lines, their ids and then
a checkpoint ``@<size>`` (the JSONL size they bring it to) are appended and fsynced. On open
the last checkpoint the file reaches is used if the JSONL line that ends there has the last id
before it; lines after it are scanned. A missing, foreign or unreadable index gives None: the
caller scans the whole file and starts a new one. The JSONL stays the truth; this only saves
reading it.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path


class IdIndex:
    """The sidecar file of one JSONL file."""

    def __init__(self, jsonl: Path) -> None:
        self.jsonl = jsonl
        self.path = jsonl.with_name(jsonl.name + ".ids")

    def load(self, size: int) -> tuple[list[str], int] | None:
        """Ids and the JSONL size they cover (<= ``size``), verified; None when unusable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        found = _last_checkpoint(data, size)
        if found is None:
            return None
        ids, covered, end = found
        if covered and (not ids or _id_ending_at(self.jsonl, covered) != ids[-1]):
            return None
        os.truncate(self.path, end)  # drop what a crash or a longer file left after it
        return ids, covered

    def reset(self) -> None:
        """Start the index again, empty (before a full scan)."""
        self.path.write_bytes(b"")

    def append(self, ids: list[str], size: int) -> None:
        """Record ids just fsynced to the JSONL, which is now ``size`` bytes; fsync."""
        payload = "".join(f"{i}\n" for i in ids) + f"@{size}\n"
        with self.path.open("ab") as fh:
            fh.write(payload.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())


def _last_checkpoint(data: bytes, size: int) -> tuple[list[str], int, int] | None:
    """(ids before it, JSONL size, index bytes up to it) of the last checkpoint <= size."""
    ids: list[str] = []
    best: tuple[int, int, int] | None = None
    pos = 0
    for line in data.split(b"\n")[:-1]:  # the piece after the last newline is unfinished
        pos += len(line) + 1
        if not line.startswith(b"@"):
            ids.append(line.decode("utf-8", "replace"))
            continue
        try:
            covered = int(line[1:])
        except ValueError:
            return None
        if covered > size:
            break
        best = (covered, len(ids), pos)
    if best is None:
        return None
    covered, count, end = best
    del ids[count:]
    return ids, covered, end


def _id_ending_at(jsonl: Path, offset: int) -> str | None:
    """The id of the JSONL line that ends (newline included) at ``offset``, if it does."""
    with jsonl.open("rb") as fh:
        fh.seek(offset - 1)
        if fh.read(1) != b"\n":
            return None
        start = last_newline_end(fh, offset - 1)
        fh.seek(start)
        try:
            return str(json.loads(fh.read(offset - start))["id"])
        except (ValueError, KeyError, TypeError):
            return None


def last_newline_end(fh: io.BufferedIOBase, size: int) -> int:
    """Offset just after the last newline before ``size`` (0 if none), scanning back in blocks."""
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        fh.seek(start)
        block = fh.read(pos - start)
        found = block.rfind(b"\n")
        if found >= 0:
            return start + found + 1
        pos = start
    return 0
