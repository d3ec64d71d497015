"""The JSONL file: append-only, fsynced, one line per sample id, repaired on open.

A file belongs to one run and one collector at a time. Before anything else, the file is
locked at the OS level (a second collector on it is refused at once, even if the first is
paused) and its first line is checked: a file of another run, or one that is not EagleGen's
output, is refused and left byte for byte as it was. The ids already in the file come from its
index (``collector/id_index.py``) and the lines written since, so a restart costs the new
lines, not the whole file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from collector.id_index import IdIndex, last_newline_end
from common.errors import ConfigError

log = logging.getLogger("eaglegen.collector")
# A record line starts like this (``Record.to_json``): how a cut first line is still known.
RECORD_START = b'{"schema":'
FIRST_LINE_MAX = 64 * 1024 * 1024


class JsonlSink:
    """An append-only JSONL file of one run that knows which ids it already holds."""

    def __init__(self, path: Path, run: str) -> None:
        self.path = path
        self.run = run
        self.ids: set[str] = set()
        self.repaired_bytes = 0
        self.scanned_bytes = 0  # read at start-up: only what the id index did not cover
        self.index = IdIndex(path)
        if path.is_dir():
            raise ConfigError(f"--out {path} is a folder; give a file such as {path}/run.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("ab")
        try:
            self._lock_file()
            self._check_owner()
            self._repair()
            self._load_ids()
        except BaseException:
            self._fh.close()
            raise

    def _lock_file(self) -> None:
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{self.path} is open in another collector (perhaps paused); "
                "stop it first, or collect into another file"
            ) from None

    def _check_owner(self) -> None:
        first = _first_line(self.path)
        if not first:
            return
        record = _as_record(first)
        if record is None:
            if first.endswith(b"\n") or not first.startswith(RECORD_START):
                raise ConfigError(
                    f"{self.path} is not an EagleGen output file (its first line is not a "
                    "record); it was left as it is: choose another --out"
                )
            return  # a first line cut by a crash: ours, repaired below
        if record.get("run") != self.run:
            raise ConfigError(
                f"{self.path} holds records of run {record.get('run')!r}, not {self.run!r}; "
                "collect each run into its own file (nothing was taken from Redis)"
            )

    def _repair(self) -> None:
        # A crash mid-write leaves a partial last line: cut it, its result is still in Redis.
        with self.path.open("r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            end = last_newline_end(fh, size)
            if end < size:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
                self.repaired_bytes = size - end
                log.warning("%s: removed a partial last line (%d bytes)", self.path, size - end)

    def _load_ids(self) -> None:
        size = self.path.stat().st_size
        loaded = self.index.load(size)
        if loaded is None:  # no usable index: read the whole file once, and index it
            self.index.reset()
            loaded = [], 0
        known, covered = loaded
        self.ids = set(known)
        fresh = self._scan(covered)
        self.index.append(fresh, size)

    def _scan(self, start: int) -> list[str]:
        found: list[str] = []
        with self.path.open("rb") as fh:
            fh.seek(start)
            offset = start
            for line in fh:
                try:
                    found.append(str(json.loads(line)["id"]))
                except (ValueError, KeyError, TypeError):
                    log.warning("%s: not a record line at byte %d, left as is", self.path, offset)
                offset += len(line)
        self.scanned_bytes = offset - start
        self.ids.update(found)
        return found

    def append(self, items: list[tuple[str, str]]) -> int:
        """Write (id, json) lines whose id is new, then flush and fsync; returns lines written."""
        fresh: list[tuple[str, str]] = []
        for sample_id, line in items:
            if sample_id not in self.ids:
                self.ids.add(sample_id)
                fresh.append((sample_id, line))
        if fresh:
            self._fh.write(("\n".join(line for _, line in fresh) + "\n").encode("utf-8"))
            self._fh.flush()
            os.fsync(self._fh.fileno())
            # After the lines are on disk: the index never names a line the file lacks.
            self.index.append([sample_id for sample_id, _ in fresh], self._fh.tell())
        return len(fresh)

    def close(self) -> None:
        """Flush, fsync, unlock and close."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()  # closing the descriptor drops the flock


def _first_line(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.readline(FIRST_LINE_MAX)


def _as_record(line: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if isinstance(data, dict) and "schema" in data and "id" in data and "run" in data:
        return data
    return None
