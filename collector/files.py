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
    the output file and wrote no line to it (an index of nothing goes with it)."""
    index = IdIndex(out).path
    new = [p for p in (out, index) if not p.exists()]
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            if out in new and out.exists() and out.stat().st_size == 0:
                for path in new:
                    path.unlink(missing_ok=True)
        raise
