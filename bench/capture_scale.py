"""Capture at a real target's size: on a GPU (``--device cuda:N``) or with the synthetic
stand-in for one (``--synthetic``), side by side in one run (bench/bench_capture.py runs it).

Rows: ``--rows`` of ``--tokens`` each, then the same count with lengths drawn like a chat
dataset's (log-normal, mean ~1,460, 16 to 8,192). Each scenario is timed from the first file
on disk to the last manifest line (model loading excluded), and reports tokens/s, its share of
the limit (GPU: the forward pass alone; synthetic: the stand-in's rate), GB/s written, the
worker's CPU-seconds per GB, its thread count, peak RSS, and on a GPU how busy it was.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import Procs, wait_for

# Named real shapes, random weights: no download.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
        max_position_embeddings=8192,
    ),
}


def build_model(out: Path, shape: str, device: str, weights: bool) -> Path:
    """A random LlamaForCausalLM of ``shape`` in bf16 (only config.json without ``weights``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], dtype="bfloat16", tie_word_embeddings=False)
    if not weights:
        out.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(out)
        return out
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    del model
    _free_device()
    return out


def row_sets(rows: int, tokens: int, vocab: int) -> dict[str, list[list[int]]]:
    rng = random.Random(0)
    mixed = [min(max(int(rng.lognormvariate(7.0, 0.7)), 16), 8192) for _ in range(rows)]
    return {
        f"fixed-{tokens}": [[rng.randrange(1, vocab) for _ in range(tokens)] for _ in range(rows)],
        "mixed": [[rng.randrange(1, vocab) for _ in range(n)] for n in mixed],
    }


@dataclass
class Usage:
    """A process's CPU seconds and thread count, read from /proc."""

    pid: int

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0


class GpuBusy:
    """``nvidia-smi`` utilisation every 100 ms while running (empty without a GPU)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> GpuBusy:
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        except FileNotFoundError:
            return self
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip().isdigit():
                self.samples.append(int(line.strip()))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"gpu_busy_mean": statistics.mean(self.samples),
                "gpu_busy_median": statistics.median(self.samples)}  # fmt: skip


def forward_limit(model_dir: Path, rows: list[list[int]], device: str, batch: int) -> float:
    """Tokens/s of the forward pass alone (states kept on the device), batches synchronised."""
    import torch

    from capture.forward import TargetModel

    model = TargetModel(str(model_dir), device)
    aux = (2, model.layers // 2, model.layers - 3)
    chunks = [_padded(chunk, device) for chunk in _by_budget(rows, batch * 2048)]
    model._stacked(chunks[0], aux)  # warm-up
    torch.cuda.synchronize()
    started = time.perf_counter()
    for ids in chunks:
        model._stacked(ids, aux)  # the pass and its states, kept on the device
        torch.cuda.synchronize()
    took = time.perf_counter() - started
    del model
    _free_device()
    return sum(len(r) for r in rows) / took


def _free_device() -> None:
    import gc

    import torch

    gc.collect()  # the model's norm hook holds it in a cycle
    torch.cuda.empty_cache()


def _by_budget(rows: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Rows sorted by length, in batches of at most ``budget`` padded tokens (the least
    padding there can be; 8 rows of 8,192 tokens ran out of memory on an H200)."""
    chunks: list[list[list[int]]] = [[]]
    for row in sorted(rows, key=len):
        if chunks[-1] and len(row) * (len(chunks[-1]) + 1) > budget:
            chunks.append([])
        chunks[-1].append(row)
    return chunks


def _padded(rows: list[list[int]], device: str) -> Any:
    import torch

    longest = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (longest - len(r)) for r in rows], device=device)


def worker_run(
    procs: Procs, redis_url: str, model_dir: Path, tokenized: Path, out: Path,
    args: list[str], rows: list[list[int]], layout: str,
) -> dict[str, Any]:  # fmt: skip
    """One capture worker over ``rows``; timed from its first file to its last manifest line."""
    tag = uuid.uuid4().hex[:8]
    env = {"EAGLEGEN_REDIS_URL": redis_url, "EAGLEGEN_CAPTURE_QUEUE": f"bench-cq-{tag}",
           "EAGLEGEN_CAPTURE_TOKEN_BUDGET": "16384"}  # fmt: skip
    run = f"bench-{tag}"
    enq = procs.run(["capture", "enqueue", str(tokenized), "--run", run, "--out", str(out),
                     "--layout", layout], env=env)  # fmt: skip
    assert enq.returncode == 0, enq.stderr
    worker = procs.start(f"capture-{tag}", ["capture", "worker", "--model", str(model_dir),
                                            *args], env=env)  # fmt: skip
    manifest = out / "manifest.jsonl"

    def lines() -> int:
        return len(manifest.read_text().splitlines()) if manifest.exists() else 0

    wait_for(lambda: any(out.rglob("*.safetensors")) or any(out.rglob("data_*.ckpt")),
             900, "the first file", 0.01)  # fmt: skip
    usage = Usage(worker.pid)
    cpu0, started, threads, anon = usage.cpu_s(), time.perf_counter(), 0, 0
    done0 = lines()
    with GpuBusy() as busy:
        while lines() < len(rows):
            threads = max(threads, usage.status("Threads"))
            anon = max(anon, usage.status("RssAnon"))
            time.sleep(0.05)
            if time.perf_counter() - started > 1200:
                raise TimeoutError("the capture worker did not finish in 20 minutes")
    took, cpu = time.perf_counter() - started, usage.cpu_s() - cpu0
    entries = [json.loads(x) for x in manifest.read_text().splitlines()]
    timed = entries[done0:]
    nbytes = sum(e["bytes"] for e in timed)
    result = {
        "tokens_per_s": sum(e["tokens"] for e in timed) / took, "seconds": took,
        "gb_per_s": nbytes / took / 1e9, "cpu_s_per_gb": cpu / (nbytes / 1e9),
        "cores_busy": cpu / took, "threads": threads,
        "rss_peak_gib": usage.status("VmHWM") / 2**20, "rss_anon_max_gib": anon / 2**20,
        "rss_file_now_gib": usage.status("RssFile") / 2**20, **busy.summary(),
    }  # fmt: skip
    worker.terminate()
    worker.wait(60)
    return result


def plain_loop(target: Any, rows: list[list[int]], out: Path, batch: int, layout: str) -> dict:
    """What a script does: forward, states to the host, encode, write; one row after another."""
    from capture.layers import plan
    from capture.layouts import encode
    from capture.rows import Row

    out.mkdir(parents=True, exist_ok=True)
    aux = plan(layout, target.layers, None).aux
    cpu0, started, nbytes = time.process_time(), time.perf_counter(), 0
    with GpuBusy() as busy:
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            for i, (ids, states) in enumerate(zip(chunk, target.forward(chunk, aux), strict=True)):
                states.wait()
                row = Row(start + i, f"s{start + i}", ids, [1] * len(ids))
                data = encode(layout, row, states, "x")
                (out / f"{start + i}.bin").write_bytes(data)
                nbytes += len(data)
    took = time.perf_counter() - started
    return {"tokens_per_s": sum(len(r) for r in rows) / took, "seconds": took,
            "gb_per_s": nbytes / took / 1e9,
            "cpu_s_per_gb": (time.process_time() - cpu0) / (nbytes / 1e9),
            **busy.summary()}  # fmt: skip


def scale(args: Any, save: Any) -> dict[str, Any]:
    """Every scenario over both row sets; ``save`` is called with the results after each."""
    import shutil
    import tempfile

    from tests.capture.helpers import write_tokenized

    synthetic = args.device is None
    tmp = Path(tempfile.mkdtemp(prefix="bench-capture-", dir=args.work))
    model_dir = build_model(tmp / "model", args.shape, args.device or "cpu", not synthetic)
    vocab = SHAPES[args.shape]["vocab_size"]
    places = {"tmpfs": Path(tempfile.mkdtemp(prefix="bench-capture-", dir=args.tmpfs))}
    if args.disk:
        places["disk"] = Path(tempfile.mkdtemp(prefix="bench-capture-", dir=args.disk))
    concurrencies = [int(c) for c in str(args.concurrency).split(",")]

    def worker_args(concurrency: int) -> list[str]:
        where = (["--backend", "synthetic", "--synthetic-rate", str(args.rate)]
                 if synthetic else ["--device", args.device])  # fmt: skip
        return ["--concurrency", str(concurrency), *where]

    results: dict[str, Any] = {"shape": args.shape, "device": args.device or "synthetic",
                               "concurrency": args.concurrency, "layout": args.layout,
                               "rows": args.rows, "cores": os.cpu_count()}  # fmt: skip
    try:
        (tmp / "logs").mkdir()
        with Procs(tmp / "logs") as procs:
            for name, rows in row_sets(args.rows, args.tokens, vocab).items():
                got: dict[str, Any] = results.setdefault(name, {})
                tokenized = write_tokenized(tmp / f"tok-{name}", rows, model_dir)
                got["limit_tokens_per_s"] = (
                    args.rate if synthetic else forward_limit(model_dir, rows, args.device, 8)
                )
                save(results)
                first = name.startswith("fixed")
                if first:  # the plain loop and the disk once, on rows of one length
                    got["plain_loop"] = _loop(model_dir, args, synthetic, rows, places["tmpfs"])
                    save(results)
                runs = [(f"{where}_c{c}", folder, c) for c in concurrencies
                        for where, folder in places.items()]  # fmt: skip
                for label, folder, c in runs if first else runs[-1:]:
                    out = folder / f"run-{name}"
                    got[f"worker_{label}"] = worker_run(
                        procs, args.redis_url, model_dir, tokenized, out, worker_args(c), rows,
                        args.layout,
                    )  # fmt: skip
                    shutil.rmtree(out)
                    save(_shares(results))
    finally:
        for folder in [tmp, *places.values()]:
            shutil.rmtree(folder, ignore_errors=True)
    return _shares(results)


def _loop(model_dir: Path, args: Any, synthetic: bool, rows: list[list[int]], tmpfs: Path) -> Any:
    import shutil

    target = _target(model_dir, args, synthetic)
    got = plain_loop(target, rows, tmpfs / "loop", 8, args.layout)
    del target
    if not synthetic:
        _free_device()
    shutil.rmtree(tmpfs / "loop")
    return got


def _target(model_dir: Path, args: Any, synthetic: bool) -> Any:
    if synthetic:
        from capture.synthetic import SyntheticTarget

        return SyntheticTarget(str(model_dir), args.rate)
    from capture.forward import TargetModel

    return TargetModel(str(model_dir), args.device)


def _shares(results: dict[str, Any]) -> dict[str, Any]:
    for got in results.values():
        if not isinstance(got, dict) or "limit_tokens_per_s" not in got:
            continue
        for value in got.values():
            if isinstance(value, dict) and "tokens_per_s" in value:
                value["share_of_limit"] = round(
                    value["tokens_per_s"] / got["limit_tokens_per_s"], 3
                )
    return results
