"""Capture on CPU: a capture worker against a plain in-process loop, bytes per token, RSS.

    .venv/bin/python bench/bench_capture.py [--redis-url URL]
        [--rows 120] [--tokens 256] [--hidden 256] [--layers 8] [--concurrency 8]

The same rows (random ids, ``--tokens`` each) of the same random Qwen3 (``--layers`` x
``--hidden``, float32) go through:

- the plain loop (run before and after the worker, the faster kept): one process, the
  target loaded once, rows in batches of ``--concurrency``
  (``TargetModel.forward``), each row's safetensors bytes built and written with a plain
  ``open().write()``: what a script around transformers does;
- a real capture worker (``eaglegen capture worker``, threads pool, ``--concurrency``) on a real
  Redis, after ``eaglegen capture enqueue``: timed from the first file on disk to the last
  manifest line (the model load is not counted, nor in the loop).

Reported: rows/s and tokens/s of both and their ratio, bytes per token on disk against
4 x H x dtype size, and the worker's peak RSS (VmHWM). JSON in bench/results/capture.json.

At a real target's size (bench/capture_scale.py):

    .venv/bin/python bench/bench_capture.py --device cuda:0 --shape llama-3.1-8b [--disk DIR]
    .venv/bin/python bench/bench_capture.py --synthetic [--rate 34000] [--shape llama-3.1-8b]

the first on a GPU (random weights built on the device, bf16), the second on any machine: the
GPU's forward pass replaced by a stand-in that hands out real-size states at ``--rate`` tokens/s
(``--backend synthetic``), so what is measured is the pipeline's own cost.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack import save_results  # noqa: E402

from tests.harness import Procs, redis_url_or_own, wait_for  # noqa: E402


def build(tmp: Path, args: argparse.Namespace) -> tuple[Path, Path, list[list[int]]]:
    import random

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.capture.helpers import write_tokenized

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=args.hidden // 4, max_position_embeddings=8192, tie_word_embeddings=False,
    )  # fmt: skip
    model_dir = tmp / "model"
    Qwen3ForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    rng = random.Random(0)
    rows = [[rng.randrange(1, 4096) for _ in range(args.tokens)] for _ in range(args.rows)]
    return model_dir, write_tokenized(tmp / "tok", rows, model_dir), rows


def plain_loop(model_dir: Path, tokenized: Path, out: Path, batch: int) -> float:
    from capture.forward import TargetModel
    from capture.layers import plan
    from capture.layouts import encode
    from capture.rows import Rows

    model = TargetModel(str(model_dir))
    rows = Rows(tokenized)
    aux = plan("speculators", model.layers, None).aux
    out.mkdir(parents=True)
    started = time.perf_counter()
    for start in range(0, len(rows), batch):
        chunk = [rows[i] for i in range(start, min(start + batch, len(rows)))]
        for row, states in zip(
            chunk, model.forward([r.input_ids for r in chunk], aux), strict=True
        ):
            (out / f"hs_{row.index}.safetensors").write_bytes(
                encode("speculators", row, states, "x")
            )
    return time.perf_counter() - started


def worker_run(redis_url: str, model_dir: Path, tokenized: Path, out: Path, tmp: Path,
               concurrency: int, rows: int) -> dict[str, Any]:  # fmt: skip
    tag = uuid.uuid4().hex[:8]
    env = {"EAGLEGEN_REDIS_URL": redis_url, "EAGLEGEN_CAPTURE_QUEUE": f"bench-cq-{tag}"}
    run = f"bench-{tag}"
    with Procs(tmp / "logs", env) as procs:
        (tmp / "logs").mkdir(exist_ok=True)
        args = ["capture", "enqueue", str(tokenized), "--run", run, "--out", str(out)]
        done = procs.run([*args, "--layout", "speculators"])
        assert done.returncode == 0, done.stderr
        worker = procs.start("capture", ["capture", "worker", "--model", str(model_dir),
                                         "--concurrency", str(concurrency)])  # fmt: skip
        folder = out / "hidden_states"
        wait_for(lambda: folder.is_dir() and any(folder.iterdir()), 600, "the first file", 0.01)
        started = time.perf_counter()
        manifest = out / "manifest.jsonl"

        def lines() -> int:
            return len(manifest.read_text().splitlines()) if manifest.exists() else 0

        wait_for(lambda: lines() >= rows, 1200, "the last manifest line", 0.02)
        took = time.perf_counter() - started
        status = Path(f"/proc/{worker.pid}/status").read_text()
        hwm = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM"))
    first_file_rows = 1  # the timer starts once one row is on disk
    return {"seconds": took, "rows_timed": rows - first_file_rows, "rss_peak_mib": hwm / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis-url", help="a Redis to use (default: one of its own, on a free port)"
    )
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--concurrency", default="8", help="N, or N,M,…: workers at each")
    parser.add_argument("--synthetic", action="store_true", help="a stand-in for the GPU")
    parser.add_argument("--device", help="cuda:N: the real forward pass on that GPU")
    parser.add_argument("--shape", default="llama-3.1-8b", help="llama-3.1-8b or tiny")
    parser.add_argument("--rate", type=float, default=34000.0, help="the stand-in's tokens/s")
    parser.add_argument("--layout", default="speculators")
    parser.add_argument("--disk", help="a folder on a disk, beside the tmpfs run")
    parser.add_argument("--work", help="where the model and rows go (default: the temp dir)")
    parser.add_argument("--tmpfs", default="/dev/shm", help="the tmpfs folder for the runs")
    parser.add_argument("--json", help="also write the results here, after every phase")
    args = parser.parse_args()
    if args.synthetic or args.device:
        from capture_scale import scale

        args.redis_url = redis_url_or_own(args.redis_url)
        if args.synthetic:
            args.device = None

        def save(got: dict[str, Any]) -> None:
            if args.json:
                Path(args.json).write_text(json.dumps(got, indent=1))

        result = scale(args, save)
        save_results("capture-scale", result)
        print(json.dumps(result, indent=1))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    try:
        model_dir, tokenized, _ = build(tmp, args)
        # The loop before and after the worker, the faster one kept: on a shared machine
        # the load moves, and the worker should not win by running in a quieter minute.
        loop_s = plain_loop(model_dir, tokenized, tmp / "loop", int(args.concurrency))
        cap = worker_run(redis_url_or_own(args.redis_url), model_dir, tokenized, tmp / "out", tmp,
                         int(args.concurrency), args.rows)  # fmt: skip
        loop_s = min(loop_s, plain_loop(model_dir, tokenized, tmp / "loop2", int(args.concurrency)))
        files = list((tmp / "out" / "hidden_states").iterdir())
        on_disk = sum(p.stat().st_size for p in files)
        tokens = args.rows * args.tokens
        ideal = 4 * args.hidden * 4
        loop_rps = args.rows / loop_s
        cap_rps = cap["rows_timed"] / cap["seconds"]
        result = {
            "rows": args.rows, "tokens_per_row": args.tokens, "hidden": args.hidden,
            "layers": args.layers, "concurrency": args.concurrency,
            "loop_rows_per_s": round(loop_rps, 2), "worker_rows_per_s": round(cap_rps, 2),
            "loop_tokens_per_s": round(loop_rps * args.tokens), "worker_tokens_per_s":
            round(cap_rps * args.tokens), "ratio": round(cap_rps / loop_rps, 3),
            "bytes_per_token": round(on_disk / tokens, 1), "ideal_bytes_per_token": ideal,
            "bytes_ratio": round(on_disk / tokens / ideal, 4),
            "worker_rss_peak_mib": round(cap["rss_peak_mib"], 1),
        }  # fmt: skip
        save_results("capture", result)
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
