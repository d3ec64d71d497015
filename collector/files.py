"""The files a collector creates, removed again when it gives up before writing anything (a
second collector refused the run's lock must not leave an empty output file behind)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from collector.id_index import IdIndex


@contextlib.contextmanager
def created_files(out: Path) -> Iterator[None]:
    """On an error in the body, remove the output file and its id index if the body created
    them and they are still empty."""
    paths = [out, IdIndex(out).path]
    new = [p for p in paths if not p.exists()]
    try:
        yield
    except BaseException:
        for path in new:
            with contextlib.suppress(OSError):
                if path.exists() and path.stat().st_size == 0:
                    path.unlink()
        raise
