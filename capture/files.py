"""Writing a row's file exactly once: a temporary name in the same folder, fsync, rename.

A reader (the manifest, a trainer walking the folder) sees either no file or the whole file:
the temporary name starts with a dot and ends in ``.tmp``, which neither trainer's reader
takes, and a crash leaves at most such a file, removed when the row runs again. A file at
the final path that EagleGen did not write is never replaced.
"""

from __future__ import annotations

import errno
import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import DiskFull, LeaseLost, NotOurs

TMP_SUFFIX = ".tmp"
# Disk errors that more room can fix; any other OSError is a bug or a misconfiguration.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class Written:
    """A file on disk: its size and checksum (for the manifest)."""

    bytes: int
    sha256: str


def sha256_of(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while piece := fh.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def write_atomic(
    path: Path, data: bytes, ours: Callable[[Path], bool],
    still_held: Callable[[], bool] = lambda: True,
) -> Written:  # fmt: skip
    """Put ``data`` at ``path`` whole or not at all; ``ours(path)`` decides whether an
    existing file there may be replaced (an earlier attempt of the same row). ``still_held``
    is asked right before the rename: a writer that lost its row meanwhile (paused past its
    lease while another wrote the row and its manifest line) must not replace that file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not ours(path):
        raise NotOurs(f"{path} exists and was not written by this capture run; left as it is")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    try:
        _write_synced(tmp, data)
        if not still_held():
            tmp.unlink(missing_ok=True)
            raise LeaseLost(f"{path.name}: the row is another worker's now; not replaced")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in _NO_ROOM:
            raise DiskFull(f"no room for {path.name} ({len(data)} bytes): {exc.strerror}") from exc
        raise
    _sync_dir(path.parent)
    return Written(len(data), hashlib.sha256(data).hexdigest())


def _write_synced(tmp: Path, data: bytes) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk too.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stale_temporaries(folder: Path) -> list[Path]:
    """Temporary files a crash left (never counted, never read by a trainer)."""
    if not folder.is_dir():
        return []
    return [p for p in folder.rglob(f".*{TMP_SUFFIX}") if p.is_file()]
