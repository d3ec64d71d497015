"""Writing a row's file exactly once: a temporary file beside it, fsync, rename.

A reader (the manifest, a trainer walking the folder) sees either no file or the whole file.
Every attempt's temporary file lies in the row's own temporaries folder, named by the row's
file (``.<name>.tmp/<random>.part``: a dot folder, a suffix neither trainer's reader takes),
so the attempt that completes the row finds and removes them all, a killed attempt's
included. Removing them also fences a writer that lost the row while paused after its last
check: its rename finds no file. A rename that slipped in between ours and that removal is
seen by the inode at the final path, and our file is written again. A file at the final path
that EagleGen did not write is never replaced.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import DiskFull, LeaseLost, NotOurs

TMP_SUFFIX = ".tmp"
PART_SUFFIX = ".part"
REWRITES = 3  # a file replaced behind our back is written again at most this often
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


def temporaries_of(path: Path) -> Path:
    """The folder of every attempt's temporary files for the file at ``path``."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


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
    for _ in range(REWRITES):
        inode = _replace(path, data, still_held)
        _clear(temporaries_of(path))  # every attempt's, a killed or paused one's too
        if os.stat(path).st_ino == inode:
            _sync_dir(path.parent)
            return Written(len(data), hashlib.sha256(data).hexdigest())
    raise LeaseLost(f"{path.name}: replaced by another writer {REWRITES} times; not ours")


def _replace(path: Path, data: bytes, still_held: Callable[[], bool]) -> int:
    """Write a temporary file, check, rename it to ``path``; returns its inode."""
    tmp = temporaries_of(path) / f"{uuid.uuid4().hex[:8]}{PART_SUFFIX}"
    try:
        inode = _write_synced(tmp, data)
        if not still_held():
            _clear_own(tmp)
            raise LeaseLost(f"{path.name}: the row is another worker's now; not replaced")
        os.replace(tmp, path)
    except FileNotFoundError:  # the row's new holder removed our temporary file
        raise LeaseLost(f"{path.name}: the row was completed by another worker") from None
    except OSError as exc:
        _clear_own(tmp)
        if exc.errno in _NO_ROOM:
            raise DiskFull(f"no room for {path.name} ({len(data)} bytes): {exc.strerror}") from exc
        raise
    return inode


def _write_synced(tmp: Path, data: bytes) -> int:
    tmp.parent.mkdir(exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def _clear_own(tmp: Path) -> None:
    tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # others' files still in it: theirs to remove
        tmp.parent.rmdir()


def _clear(folder: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):  # gone already, or a writer just put a file in it
        folder.rmdir()


def _sync_dir(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk too.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stale_temporaries(folder: Path) -> list[Path]:
    """Temporary files a crash left (never counted, never read by a trainer): in rows'
    temporaries folders, and loose ones an older version left."""
    if not folder.is_dir():
        return []
    found = folder.rglob(f".*{TMP_SUFFIX}")
    return [f for p in found for f in (p.iterdir() if p.is_dir() else [p]) if f.is_file()]
