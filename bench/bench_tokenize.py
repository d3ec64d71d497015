"""Benchmark ``eaglegen tokenize`` against the raw fast tokenizer, and its memory on big inputs.

Speed: N synthetic multi-turn records with reasoning go through the whole job (parse, render,
masks, tokenize, Arrow + JSONL output) and, for comparison, the same rendered row texts go
through ``tokenizer(texts)`` (a plain batch encode). Both run here, in one process, one after
the other. Memory: the job runs in a fresh subprocess per input size and reports its peak RSS
(``resource.getrusage``); flat memory means the 100k-row figure is close to the 10k-row one.

    .venv/bin/python bench/bench_tokenize.py --rows 20000 --json bench/tokenize.json

The tokenizer is a byte-level BPE trained locally (no hub access) with the family's special
tokens and official chat template, from tests/training/local_tokenizers.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


_SYLLABLES_TEXT = (
    "ka lo mi ne ru ta si po de fa gu he ji ko la mu na pe qi ro su te vu wa xe yo ze ba ce "
    "di fo ga hi ju ke li mo nu pa qu re so tu vi we xi yu za bo cu da fe go hu"
)
SYLLABLES = tuple(_SYLLABLES_TEXT.split())


def lexicon(seed: int, size: int = 40_000) -> list[str]:
    """Return `size` distinct pseudo-words, so text has a realistic spread of rare words."""
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choices(SYLLABLES, k=rng.choice((1, 2, 2, 3, 3, 4))))] = None
    return list(words)


def sentence_pool(seed: int, size: int = 4000) -> list[str]:
    """Return a pool of sentences with Zipf-distributed words, numbers and punctuation."""
    rng = random.Random(seed)
    words = lexicon(seed)
    weights = [1 / (rank + 1) ** 1.05 for rank in range(len(words))]
    cum = list(itertools.accumulate(weights))
    pool = []
    for _ in range(size):
        picked = rng.choices(words, cum_weights=cum, k=rng.randint(6, 24))
        if rng.random() < 0.2:
            picked.insert(rng.randrange(len(picked)), str(rng.randint(0, 99999)))
        pool.append(" ".join(picked).capitalize() + rng.choice(".,?!:;") + rng.choice(" \n"))
    return pool


def text(rng: random.Random, pool: list[str], lo: int, hi: int) -> str:
    """Return a paragraph of lo..hi sentences from the pool."""
    return "".join(rng.choice(pool) for _ in range(rng.randint(lo, hi))).strip()


def record(rng: random.Random, pool: list[str], i: int) -> dict[str, Any]:
    """Return one synthetic schema-1 record with 1-3 turns, reasoning and usage."""
    turns = rng.choices([1, 2, 3], weights=[5, 3, 2])[0]
    conv: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    meta = []
    for _ in range(turns):
        conv.append({"role": "user", "content": text(rng, pool, 1, 4)})
        conv.append(
            {
                "role": "assistant",
                "content": text(rng, pool, 3, 20),
                "reasoning_content": text(rng, pool, 3, 15),
            }
        )
        meta.append({"finish_reason": "stop", "usage": {"completion_tokens": 1}})
    gen = {"model": "bench", "finish_reason": "stop", "turns": meta}
    return {
        "schema": 1,
        "id": f"r{i:07d}",
        "run": "bench",
        "conversations": conv,
        "generation": gen,
    }


def write_input(path: Path, rows: int, seed: int = 1) -> None:
    """Write `rows` synthetic records to path as JSONL."""
    rng = random.Random(seed)
    pool = sentence_pool(seed)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(rows):
            fh.write(json.dumps(record(rng, pool, i)) + "\n")


def build_tokenizer(family: str, vocab_size: int, out: Path) -> Any:
    """Train the local tokenizer for the family and save it to out."""
    from tests.training.local_tokenizers import build_tokenizer as build

    tok = build(family, vocab_size=vocab_size, texts=sentence_pool(seed=0))
    tok.save_pretrained(str(out))
    return tok


def rendered_texts(path: Path, tok: Any) -> list[str]:
    """Return the full text of every row the job will write (prompt + generated text)."""
    from training.chat_template import template_source
    from training.records import iter_lines
    from training.rows import JobConfig, RowBuilder

    text_, name = template_source(tok, None)
    specials = tuple(tok.get_added_vocab())
    cfg = JobConfig(
        text_, name, dict(tok.special_tokens_map), specials, None, "keep", "drop", "auto"
    )
    builder = RowBuilder(tok.backend_tokenizer, cfg)
    texts = []
    for _, chunk in iter_lines(path, 1024):
        for line_no, line in chunk:
            _, rows, _ = builder.plan(line_no, line)
            texts.extend(r.prompt + r.span for r in rows)
    return texts


def cpu_seconds() -> float:
    """Return CPU seconds used so far by this process, its threads and reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def time_raw(tok: Any, texts: list[str], batch: int = 1000) -> tuple[float, float]:
    """Return (wall, CPU) seconds for ``tokenizer(texts)`` over all texts, in batches."""
    cpu, start = cpu_seconds(), time.perf_counter()
    for i in range(0, len(texts), batch):
        tok(texts[i : i + batch])
    return time.perf_counter() - start, cpu_seconds() - cpu


def time_job(path: Path, tok: Any, out: Path, num_proc: int) -> tuple[float, float, Any]:
    """Return (wall, CPU seconds, stats) for the whole tokenize job."""
    from rich.console import Console

    from training.tokenize import tokenize

    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - lives for the run
    cpu, start = cpu_seconds(), time.perf_counter()
    stats = tokenize(path, tok, out, num_proc=num_proc, progress=False, console=quiet)
    return time.perf_counter() - start, cpu_seconds() - cpu, stats


def rss_child(args: argparse.Namespace) -> None:
    """Subprocess mode: run the job once and print its peak RSS in MiB as JSON."""
    from rich.console import Console

    from training.tokenize import tokenize

    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    stats = tokenize(args.input, args.tokenizer, args.out, progress=False, console=quiet)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows_out": stats.rows_out, "peak_rss_mib": round(peak, 1)}))


def measure_rss(tmp: Path, tok_dir: Path, rows: int) -> dict[str, Any]:
    """Write an input of `rows` records, run the job in a subprocess, return its peak RSS."""
    path = tmp / f"rss-{rows}.jsonl"
    write_input(path, rows, seed=rows)
    cmd = [sys.executable, __file__, "--rss-child", "--input", str(path)]
    cmd += ["--tokenizer", str(tok_dir), "--out", str(tmp / f"rss-out-{rows}")]
    start = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result |= {"rows_in": rows, "input_mib": round(path.stat().st_size / 2**20, 1)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    path.unlink()
    return result


def main() -> None:
    """Run the speed comparison and the memory runs; print and optionally save JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--family", default="qwen3")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--num-proc", type=int, default=1)
    p.add_argument("--repeat", type=int, default=2, help="alternating runs of each; best kept")
    p.add_argument("--rss-rows", default="10000,100000", help="sizes for the memory runs")
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss_child:
        rss_child(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as name:
        tmp = Path(name)
        results = run(args, tmp)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Run all measurements in tmp and return the results."""
    tok = build_tokenizer(args.family, args.vocab_size, tmp / "tokenizer")
    path = tmp / "input.jsonl"
    write_input(path, args.rows)
    texts = rendered_texts(path, tok)
    job, raw = [], []
    # Alternate the two and keep each one's best run: other work on a shared machine
    # then disturbs both alike.
    for _ in range(args.repeat):
        wall, cpu, stats = time_job(path, tok, tmp / "out", args.num_proc)
        job.append((wall, cpu))
        raw.append(time_raw(tok, texts))
    assert stats.rows_out == len(texts), (stats.rows_out, len(texts))
    job_s, job_cpu = min(job)
    raw_s, raw_cpu = min(raw)
    results: dict[str, Any] = {
        "family": args.family,
        "vocab_size": len(tok),
        "records": args.rows,
        "rows_out": stats.rows_out,
        "tokens": stats.tokens,
        "num_proc": args.num_proc,
        "repeats": args.repeat,
        "tokenize_rows_per_s": round(stats.rows_out / job_s, 1),
        "raw_rows_per_s": round(len(texts) / raw_s, 1),
        "ratio": round(raw_s / job_s, 3),
        "tokenize_s": round(job_s, 2),
        "raw_s": round(raw_s, 2),
        "tokenize_cpu_s": round(job_cpu, 2),
        "raw_cpu_s": round(raw_cpu, 2),
        "cpu_ratio": round(raw_cpu / job_cpu, 3),
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(results), flush=True)
    if not args.skip_rss:
        sizes = [int(s) for s in args.rss_rows.split(",") if s]
        results["memory"] = [measure_rss(tmp, tmp / "tokenizer", n) for n in sizes]
    return results


if __name__ == "__main__":
    main()
