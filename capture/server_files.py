"""The files a vLLM capture server names: accepted only inside the folder set aside for them.

The path in ``kv_transfer_params.hidden_states_path`` comes from the server (or from anything
between it and the worker on a plain-http path): the worker reads and removes what it names,
so a path decides nothing by itself. It is accepted only if its folder, resolved, is
``EAGLEGEN_CAPTURE_SERVER_DIR`` resolved, it has no ``..``, and its name has the connector's
shape (``<request id>.safetensors``, vLLM's ``example_hidden_states_connector.py``); the file
and its ``.lock`` are opened without following a symlink and must be regular files (a FIFO
there would block a plain ``open``); the file is read from that one descriptor, and only if
its size fits the row. Anything else is a ``BadResponse`` naming the path, and nothing is read
or removed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from contextlib import suppress
from pathlib import Path

from common.errors import BadResponse, ConfigError, TimeoutError_

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\.safetensors")
LOCK_POLL = 0.02  # seconds between looks at a lock still held
# A safetensors header (JSON, two tensors) beyond the tensors' own bytes.
HEADER_SLACK = 64 * 1024
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def server_dir(setting: str | None) -> Path:
    """The servers' folder, resolved, or a ConfigError saying how to set it."""
    if not setting:
        raise ConfigError(
            "set EAGLEGEN_CAPTURE_SERVER_DIR to the capture servers' shared_storage_path as "
            "mounted here: the worker reads and removes server files only there"
        )
    folder = Path(setting).resolve()
    if not folder.is_dir():
        raise ConfigError(f"EAGLEGEN_CAPTURE_SERVER_DIR={setting}: not a folder here")
    return folder


def accepted(raw: str, folder: Path, url: str) -> Path:
    """``raw`` as a path in ``folder``, or a BadResponse naming it (nothing touched)."""
    given = Path(raw)
    if not given.is_absolute() or ".." in given.parts or not NAME.fullmatch(given.name):
        raise BadResponse(f"{url}: refused hidden_states_path {raw!r}: not a server file name")
    if given.parent.resolve() != folder:
        raise BadResponse(
            f"{url}: refused hidden_states_path {raw!r}: outside EAGLEGEN_CAPTURE_SERVER_DIR "
            f"({folder})"
        )
    return folder / given.name


def wait_unlocked(path: Path, timeout: float) -> None:
    """Until ``path.lock`` is gone or no longer held (vLLM releases its flock when the file is
    whole; older writers remove the lock file instead); a deadline, never a blocking open."""
    deadline = time.monotonic() + timeout
    lock = f"{path}.lock"
    while True:
        try:
            fd = os.open(lock, _OPEN)
        except FileNotFoundError:
            return
        except OSError as exc:  # ELOOP: a symlink
            raise BadResponse(f"{lock}: refused ({exc.strerror})") from None
        try:
            if _is_free(fd, lock):
                return
        finally:
            os.close(fd)
        if time.monotonic() > deadline:
            raise TimeoutError_(f"{path}: still locked after {timeout:g}s")
        time.sleep(LOCK_POLL)


def _is_free(fd: int, lock: str) -> bool:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise BadResponse(f"{lock}: not a regular file; refused")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False


def read_bounded(path: Path, most: int, url: str) -> bytes:
    """The file's bytes, read from one descriptor opened without following a symlink, and only
    if it is a regular file of at most ``most`` bytes."""
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        raise BadResponse(
            f"{url}: {path} not found here: the worker must see the server's files at the same "
            "path (same node or shared storage)"
        ) from None
    except OSError as exc:
        raise BadResponse(f"{url}: {path} refused ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadResponse(f"{url}: {path} is not a regular file; refused")
        if info.st_size > most:
            raise BadResponse(
                f"{url}: {path} holds {info.st_size} bytes, the row's states at most {most}; "
                "not read"
            )
        return fh.read(most + 1)


def remove(path: Path) -> None:
    """The file and its lock (once read: the request's own)."""
    for name in (str(path), f"{path}.lock"):
        with suppress(FileNotFoundError):
            os.remove(name)
