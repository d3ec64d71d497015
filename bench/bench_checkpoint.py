"""What checkpoints cost: Redis bytes per sample in flight and written, worker CPU per token.

    .venv/bin/python bench/bench_checkpoint.py [--redis-url URL]

A turn of N tokens is streamed in-process, one token per network read as vLLM sends them,
through the worker's real checkpoint path: ``TurnCheckpoints.due`` after every read and, when
due, a snapshot (the ids so far and the text so far, as the client builds it) written with the
fenced script (``RunStore.save_checkpoint``) to a real Redis under a real lease. Each setting
of ``EAGLEGEN_CHECKPOINT_TOKENS`` (and checkpoints off) is measured on the same stream:

- saves per turn, and bytes sent to Redis per 1,000 tokens (the first save writes the
  checkpoint whole, each later one appends what is new: common/checkpoint_log.py; an
  AOF-persisted Redis appends every one of them to its file);
- Redis bytes the sample holds at the end of the turn (``MEMORY USAGE`` of the run's prompts
  hash, minus the same hash without the checkpoint field, plus the checkpoint log);
- worker CPU (process time) per 1,000 tokens above the same loop with checkpoints off, and
  the wall time of one save (a loopback round trip plus the script).

The stream itself (HTTP, parsing) is not included: it costs the same with or without
checkpoints. Times are from a shared machine; repeat and take the minimum (``--repeats``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.models import Checkpoint, Sample, SourceRef
from common.settings import Settings
from common.store import RunStore, connect
from tests.harness import redis_url_or_own
from worker.chat.checkpoints import TurnCheckpoints

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stack import save_results

SETTINGS = (16, 32, 64, 256, 1024, None)  # None: EAGLEGEN_RESUME=off, no checkpoints
VOCAB = 151_000  # ids of a Qwen-sized vocabulary: mostly 5-6 digits in JSON
PROMPT_TOKENS = 300


def stream(n: int, seed: int = 0) -> tuple[list[int], list[str]]:
    """N token ids and their text pieces (about 4 characters each, as English averages)."""
    rnd = random.Random(seed)
    ids = [rnd.randrange(VOCAB) for _ in range(n)]
    words = ["the ", "model", " token", "s", " of", " an", " answer", "\n", " is", " here."]
    return ids, [rnd.choice(words) for _ in range(n)]


def play(store: RunStore, n: int, every: int | None) -> dict[str, float]:
    """Stream one turn of ``n`` tokens through the checkpoint path; its figures."""
    sample = Sample(id=uuid.uuid4().hex[:12], user_turns=["q"],
                    source=SourceRef(dataset="bench", row=0, format="prompt"))  # fmt: skip
    store.accept([sample])
    token = "bench:" + uuid.uuid4().hex[:8]
    assert store.take(sample.id, token, 600).outcome == "ok"
    ids, pieces = stream(n)
    prompt = list(range(PROMPT_TOKENS))
    progress = None
    if every is not None:
        settings = Settings(checkpoint_tokens=every, checkpoint_seconds=3600)
        progress = TurnCheckpoints(store, sample.id, token, settings)
    got_ids: list[int] = []
    got_text: list[str] = []
    sent = _count_sent(store)
    save_wall = 0.0
    cpu = time.process_time()
    for i in range(n):
        got_ids.append(ids[i])  # what the stream reader does per token, checkpoints or not
        got_text.append(pieces[i])
        if progress is not None and progress.due(i + 1):
            snap = Checkpoint(
                turn=0, endpoint="http://e/v1", model="m", prompt_token_ids=prompt,
                token_ids=list(got_ids), content="".join(got_text), tokens=i + 1,
            )  # fmt: skip
            started = time.perf_counter()
            progress.save(snap)
            save_wall += time.perf_counter() - started
    cpu = time.process_time() - cpu
    field = store.keys.checkpoint_field(sample.id)
    with_ckpt = store.r.memory_usage(store.keys.prompts, samples=0) or 0
    with_ckpt += store.r.memory_usage(store.keys.checkpoint_log(sample.id), samples=0) or 0
    store.r.hdel(store.keys.prompts, field)
    without = store.r.memory_usage(store.keys.prompts, samples=0) or 0
    del store.save_checkpoint  # the class's own again
    saves = progress.saves if progress is not None else 0
    store.store_result(sample.id, "{}", n, token)
    return {
        "saves": saves, "sent_bytes": sent[0], "held_bytes": with_ckpt - without, "cpu_s": cpu,
        "save_wall_ms": 1000 * save_wall / saves if saves else 0.0,
    }  # fmt: skip


def _count_sent(store: RunStore) -> list[int]:
    """Counts the bytes of header and piece of every checkpoint write from now on."""
    sent = [0]
    write = store.save_checkpoint

    def counted(sample_id: str, token: str, header: str, piece: str, log_bytes: int = 0) -> int:
        sent[0] += len(header.encode()) + len(piece.encode())
        return write(sample_id, token, header, piece, log_bytes)

    store.save_checkpoint = counted  # type: ignore[method-assign]
    return sent


def measure(store: RunStore, n: int, repeats: int) -> dict[str, dict[str, float]]:
    """Each setting's figures for a turn of ``n`` tokens (minimum CPU over the repeats)."""
    out: dict[str, dict[str, float]] = {}
    for every in SETTINGS:
        runs = [play(store, n, every) for _ in range(repeats)]
        best = min(runs, key=lambda r: r["cpu_s"])
        best["save_wall_ms"] = min(r["save_wall_ms"] for r in runs)
        out["off" if every is None else str(every)] = best
    base = out["off"]["cpu_s"]
    for figures in out.values():
        figures["cpu_ms_per_1k"] = max(figures["cpu_s"] - base, 0.0) * 1000 * 1000 / n
        figures["sent_per_1k"] = figures["sent_bytes"] * 1000 / n
    return out


def table(n: int, figures: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"turn of {n:,} tokens (+{PROMPT_TOKENS} prompt ids):",
        f"  {'checkpoint_tokens':>17} {'saves':>6} {'bytes to Redis / 1k tok':>24} "
        f"{'held at end':>12} {'worker CPU ms / 1k tok':>23} {'ms per save':>12}",
    ]
    for name, f in figures.items():
        lines.append(
            f"  {name:>17} {f['saves']:>6.0f} {f['sent_per_1k']:>24,.0f} {f['held_bytes']:>12,.0f} "
            f"{f['cpu_ms_per_1k']:>23.2f} {f['save_wall_ms']:>12.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis-url", help="a Redis to use (default: one of its own, on a free port)"
    )
    parser.add_argument("--tokens", default="1000,8000", help="turn lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()
    client = connect(redis_url_or_own(a.redis_url))
    store = RunStore(client, "eaglegen-bench", f"ckpt-{uuid.uuid4().hex[:6]}")
    results: dict[str, Any] = {}
    try:
        for n in (int(x) for x in a.tokens.split(",")):
            results[str(n)] = measure(store, n, a.repeats)
            print(table(n, results[str(n)]))
    finally:
        store.delete()
    print(f"results: {save_results('checkpoint', results)}")


if __name__ == "__main__":
    main()
