"""The JSONL file: append-only, fsynced, one line per sample id, repaired on open."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("eaglegen.collector")


class JsonlSink:
    """An append-only JSONL file that knows which ids it already holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ids: set[str] = set()
        self.repaired_bytes = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self._load_ids()
        self._fh = path.open("ab")

    def _repair(self) -> None:
        # A crash mid-write leaves a partial last line: cut it, its result is still in Redis.
        if not self.path.exists():
            return
        with self.path.open("r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            end = _last_newline_end(fh, size)
            if end < size:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
                self.repaired_bytes = size - end
                log.warning("%s: removed a partial last line (%d bytes)", self.path, size - end)

    def _load_ids(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            for number, line in enumerate(fh, 1):
                try:
                    self.ids.add(str(json.loads(line)["id"]))
                except (ValueError, KeyError, TypeError):
                    log.warning("%s:%d: not a record line, left as is", self.path, number)

    def append(self, items: list[tuple[str, str]]) -> int:
        """Write (id, json) lines whose id is new, then flush and fsync; returns lines written."""
        fresh: list[str] = []
        for sample_id, line in items:
            if sample_id not in self.ids:
                self.ids.add(sample_id)
                fresh.append(line)
        if fresh:
            self._fh.write(("\n".join(fresh) + "\n").encode("utf-8"))
            self._fh.flush()
            os.fsync(self._fh.fileno())
        return len(fresh)

    def close(self) -> None:
        """Flush and close."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


def _last_newline_end(fh: object, size: int) -> int:
    """Offset just after the last newline (0 if none), scanning back in blocks."""
    import io

    assert isinstance(fh, io.BufferedRandom)
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
