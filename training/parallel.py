"""Running RowBuilders over the input in order: a render/tokenize pipeline or a process pool."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from training.records import iter_lines
from training.rows import JobConfig, Outcome, RowBuilder

_BUILDER: RowBuilder | None = None


def _init_process(backend: Any, cfg: JobConfig) -> None:
    """Process-pool initializer: build this process's RowBuilder."""
    import os

    # Each pool process is one core's worth of work; no nested tokenizer threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _BUILDER
    _BUILDER = RowBuilder(backend, cfg)


def _work(chunk: list[tuple[int, bytes]]) -> list[Outcome]:
    """Process-pool task: process one chunk in this process's RowBuilder."""
    assert _BUILDER is not None
    return _BUILDER.process(chunk)


def outcomes(
    path: Path, backend: Any, cfg: JobConfig, num_proc: int, chunk_lines: int
) -> Iterator[tuple[int, list[Outcome]]]:
    """Yield (bytes read, outcomes) per chunk, in input order, in-process or from a pool."""
    if num_proc <= 1:
        yield from _pipelined(RowBuilder(backend, cfg), iter_lines(path, chunk_lines))
        return
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    pending: deque[tuple[int, Future[list[Outcome]]]] = deque()
    with ProcessPoolExecutor(
        num_proc, mp_context=ctx, initializer=_init_process, initargs=(backend, cfg)
    ) as pool:
        # A bounded window keeps memory flat: the file is never read far ahead of the writer.
        for done, chunk in iter_lines(path, chunk_lines):
            pending.append((done, pool.submit(_work, chunk)))
            if len(pending) >= 2 * num_proc:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()


def _pipelined(
    builder: RowBuilder, chunks: Iterator[tuple[int, list[tuple[int, bytes]]]]
) -> Iterator[tuple[int, list[Outcome]]]:
    """Yield outcomes in order, tokenizing one chunk in a thread while the next is rendered.

    The tokenizer releases the GIL, so rendering (and the caller's Arrow writing) overlaps with
    tokenization: a single process then keeps both cores busy.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    pending: deque[tuple[int, Future[list[Outcome]]]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="eaglegen-tokenize") as pool:
        for done, chunk in chunks:
            pending.append((done, pool.submit(builder.tokenize_chunk, builder.render_chunk(chunk))))
            if len(pending) >= 2:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()
