"""Prefix-cache-aware routing vs least-loaded, on four simulated servers with a prefix cache.

Each set runs twice, once per ``EAGLEGEN_ROUTING``, on fresh simulators (empty caches) that
charge ``--prefill-time-per-token`` for every prompt token not in their cache:

- mt-bench: the 80 two-turn questions of ``data/mt_bench_question.jsonl``;
- multi-turn: generated conversations of several turns (tool output as the user turns)
  behind one long shared system prompt.

One worker sends more requests than the servers have slots (cap = ``--slots`` each), so
requests wait for slots and the routing choice matters. Reported per run: makespan (every
prompt queued with the endpoints held, until the last line is on disk), prefill tokens
computed and prefix-cache hit rate (the simulators' ``/sim/stats``, warm-up excluded), and
the share of later turns that ran on their previous turn's server (from the records; the
caches are sized so that nothing is evicted, so such a turn finds its whole history cached).

    .venv/bin/python bench/bench_routing.py [--only mt-bench multi-turn] [--affinity-wait S]

Uses a Redis of its own (``EAGLEGEN_BENCH_REDIS_URL`` or ``--redis-url`` name one instead),
under its own key prefixes; writes bench/results/routing-<time>.json and prints a Markdown summary.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from stack import Sampler, Stack, save_results, work_dir  # noqa: E402

from tests.harness import ROOT, Simulator, redis_url_or_own  # noqa: E402

MT_BENCH = ROOT / "data" / "mt_bench_question.jsonl"
MODES = ("cache", "least-loaded")
TOPICS = ("disk", "queue", "cache", "network", "scheduler", "database", "index", "shard")


def mt_bench(path: Path, p: argparse.Namespace) -> Path:
    """The bundled MT-Bench questions, two turns each."""
    rows = [json.loads(line) for line in MT_BENCH.read_text().splitlines() if line.strip()]
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps({"id": f"mt-{row['question_id']}", "turns": row["turns"]}) + "\n")
    return path


def multi_turn(path: Path, p: argparse.Namespace) -> Path:
    """Conversations of ``--turns`` tool outputs behind one long shared system prompt."""
    rng = random.Random(15)
    system = " ".join(
        f"Rule {i}: when the {TOPICS[i % len(TOPICS)]} report shows item {i * 7 % 101}, "
        "check it against the runbook, quote the relevant line and say what to do next."
        for i in range(p.system_rules)
    )
    with path.open("w") as out:
        for c in range(p.conversations):
            turns = [_tool_output(rng, c, t, p.tool_lines) for t in range(p.turns)]
            out.write(json.dumps({"id": f"conv-{c}", "system": system, "turns": turns}) + "\n")
    return path


def _tool_output(rng: random.Random, conversation: int, turn: int, lines: int) -> str:
    rows = [
        f"{rng.choice(TOPICS)} {rng.randrange(10_000)} status {rng.choice(('ok', 'slow', 'down'))}"
        f" latency {rng.randrange(1, 900)} ms"
        for _ in range(lines)
    ]
    return f"Conversation {conversation}, step {turn}: the tool returned\n" + "\n".join(rows)


SETS: dict[str, Callable[[Path, argparse.Namespace], Path]] = {
    "mt-bench": mt_bench,
    "multi-turn": multi_turn,
}


def sim_options(p: argparse.Namespace) -> list[str]:
    """One simulated server: its slots, pacing, answer lengths and prefix cache."""
    return [
        "--max-num-seqs", str(p.slots), "--time-per-token", str(p.per_token),
        "--prefill-time-per-token", str(p.prefill_per_token),
        "--prefix-cache-blocks", str(p.cache_blocks), "--max-model-len", "65536",
        "--min-answer-tokens", "30", "--max-answer-tokens", "90", "--reasoning-tokens", "0",
    ]  # fmt: skip


def run_one(redis_url: str, work: Path, source: Path, mode: str, p: argparse.Namespace) -> dict:
    """One set under one routing mode, on fresh simulators; its figures."""
    with Stack(redis_url, work, f"{source.stem}-{mode}") as stack:
        sims = [stack.simulator(*sim_options(p)) for _ in range(p.servers)]
        stack.env["EAGLEGEN_ENDPOINTS"] = ",".join(sim.endpoint for sim in sims)
        env = {"EAGLEGEN_ROUTING": mode, "EAGLEGEN_MAX_INFLIGHT": str(p.slots)}
        if p.affinity_wait is not None:
            env["EAGLEGEN_AFFINITY_WAIT"] = str(p.affinity_wait)
        stack.worker(p.concurrency, **env)
        stack.warm_up(stack.dir)
        before = [sim.stats() for sim in sims]
        run, out = source.stem, stack.dir / f"{source.stem}.jsonl"
        stack.collector(run, out)
        with contextlib.ExitStack() as sampling:
            samplers = [sampling.enter_context(Sampler(sim)) for sim in sims]
            stack.enqueue_held(run, source)
            started = time.monotonic()
            stack.wait_done(run, p.timeout)
            makespan = time.monotonic() - started
        after = [sim.stats() for sim in sims]
        records = [json.loads(line) for line in out.read_text().splitlines()]
    return {"makespan_s": round(makespan, 2), **_cache_figures(before, after, sims, p),
            **_affinity(records), **_busy(samplers, p.slots)}  # fmt: skip


def _busy(samplers: list[Sampler], slots: int) -> dict[str, Any]:
    """How full the servers ran, sampled every 0.2 s until the last of them went idle."""
    end = max((row.at for s in samplers for row in s.rows if row.running), default=0.0)
    rows = [row for s in samplers for row in s.rows if row.at <= end]
    busy = [min(row.running, slots) / slots for row in rows]
    return {
        "slots_busy": round(sum(busy) / len(busy), 4) if busy else None,
        "servers_waiting_mean": round(sum(r.waiting for r in rows) / len(rows), 2) if rows else 0,
    }


def _cache_figures(
    before: list[dict], after: list[dict], sims: list[Simulator], p: argparse.Namespace
) -> dict[str, Any]:
    def delta(name: str) -> int:
        return sum(a[name] - b[name] for a, b in zip(after, before, strict=True))

    queries, hits = delta("prefix_cache_queries"), delta("prefix_cache_hits")
    return {
        "prompt_tokens": queries,
        "prefill_tokens_computed": delta("prefill_tokens_computed"),
        "cache_hit_rate": round(hits / queries, 4) if queries else None,
        "turns": delta("completed"),
        "peak_running": max(a["peak_running"] for a in after),
        "cache_blocks_used_max": max(a["prefix_cache_blocks"] for a in after),
        "evicted": any(a["prefix_cache_blocks"] >= p.cache_blocks for a in after),
    }


def _affinity(records: list[dict]) -> dict[str, Any]:
    """Later turns that ran where the turn before them ran."""
    later = same = 0
    for record in records:
        endpoints = [turn["endpoint"] for turn in record["generation"]["turns"]]
        later += len(endpoints) - 1
        same += sum(a == b for a, b in itertools.pairwise(endpoints))
    share = round(same / later, 4) if later else None
    return {"samples": len(records), "later_turns": later, "later_turns_on_previous_server": share}


def compare(runs: dict[str, dict]) -> dict[str, Any]:
    """Cache-aware against least-loaded: the issue's three goals."""
    cache, least = runs["cache"], runs["least-loaded"]
    return {
        "prefill_computed_ratio": round(
            cache["prefill_tokens_computed"] / max(least["prefill_tokens_computed"], 1), 4
        ),
        "makespan_change": round(cache["makespan_s"] / least["makespan_s"] - 1, 4),
        "later_turns_on_previous_server": cache["later_turns_on_previous_server"],
    }


def summary(results: dict[str, Any]) -> str:
    """The Markdown table of every run."""
    lines = [
        "| set | routing | makespan s | prefill tokens computed | hit rate | later turns on "
        "previous server |",
        "|---|---|---|---|---|---|",
    ]
    for name in SETS:
        for mode in MODES:
            r = results.get(name, {}).get(mode)
            if r:
                lines.append(
                    f"| {name} | {mode} | {r['makespan_s']} | {r['prefill_tokens_computed']:,} "
                    f"| {r['cache_hit_rate']:.1%} | {r['later_turns_on_previous_server']:.1%} |"
                )
    for name in SETS:
        if "vs" in results.get(name, {}):
            vs = results[name]["vs"]
            lines.append(
                f"\n{name}: prefill computed x{vs['prefill_computed_ratio']} of least-loaded's, "
                f"makespan {vs['makespan_change']:+.1%}"
            )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    """Command line: sets, sizes, pacing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("EAGLEGEN_BENCH_REDIS_URL"),
        help="a Redis to use (default: one of its own, on a free port)",
    )
    parser.add_argument("--only", nargs="*", choices=sorted(SETS), default=list(SETS))
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    parser.add_argument("--affinity-wait", type=float, help="EAGLEGEN_AFFINITY_WAIT to set")
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8, help="max_num_seqs and cap per server")
    parser.add_argument("--concurrency", type=int, default=48, help="the worker's threads")
    parser.add_argument("--per-token", type=float, default=0.02)
    parser.add_argument("--prefill-per-token", type=float, default=0.0005)
    parser.add_argument("--cache-blocks", type=int, default=16384)
    parser.add_argument("--conversations", type=int, default=48)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-rules", type=int, default=60)
    parser.add_argument("--tool-lines", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=300)
    return parser.parse_args()


def main() -> None:
    """Every chosen set under every mode, one after the other; write JSON, print Markdown."""
    p = parse_args()
    p.redis_url = redis_url_or_own(p.redis_url)
    work = work_dir("routing")
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "load_before": os.getloadavg(), "args": vars(p)}  # fmt: skip
    began = time.monotonic()
    for name in p.only:
        source = SETS[name](work / f"{name}.jsonl", p)
        runs: dict[str, Any] = {}
        for mode in p.modes:
            print(f"[bench] {name} / {mode} ...", file=sys.stderr, flush=True)
            runs[mode] = run_one(p.redis_url, work, source, mode, p)
            print(f"[bench] {name} / {mode}: {json.dumps(runs[mode])}", file=sys.stderr, flush=True)
        if set(runs) == set(MODES):
            runs["vs"] = compare(runs)
        results[name] = runs
    results["load_after"] = os.getloadavg()
    results["bench_seconds"] = round(time.monotonic() - began, 1)
    path = save_results("routing", results)
    print(summary(results))
    print(f"\n{results['bench_seconds']} s; full results: {path}")
    shutil.rmtree(work)  # logs and JSONL of the runs; kept when a run fails


if __name__ == "__main__":
    main()
