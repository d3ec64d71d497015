"""``make bench``: does EagleGen keep a server exactly saturated, and what does it cost?

Side by side in one run, on loopback against the simulator (a stand-in for vLLM, not a model):

- utilisation: S slots, a time per token, 1,000 prompts of varied answer lengths. EagleGen
  (cap S) vs the ideal (simulator's completion tokens x time per token / S) and vs the
  baseline (bench/baseline_asyncio.py) at several concurrencies on the same server.
- adaptive: the same with no cap given and ``EAGLEGEN_ADAPTIVE=true``; the simulator's capacity
  is changed twice mid-run through ``/sim/config``.
- overhead: a zero-latency simulator streaming one token a chunk (as vLLM does); samples/s
  and CPU per sample and per 1,000 tokens through the whole path (enqueue -> worker -> Redis ->
  collector -> JSONL) vs the baseline, not streaming and streaming; Redis commands, round
  trips and CPU per sample (so the samples/s one Redis core can carry); enqueue rows/s.
- memory: worker RSS at 128 and 512 requests in flight; Redis bytes per queued sample and per
  stored result (``MEMORY USAGE``, exact, this database only).
- scale: 2 workers x 2 endpoints vs 1 x 1 under a cap below the servers' capacity; the
  simulators' own ``peak_running`` must never exceed the cap.

    .venv/bin/python bench/bench_capacity.py [--only utilisation adaptive ...]

Writes bench/results/capacity-<time>.json and prints a Markdown summary.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from stack import (  # noqa: E402
    CLIENT,
    RedisUse,
    Row,
    Sampler,
    Stack,
    cpu_seconds,
    rss_mib,
    save_results,
    work_dir,
    write_prompts,
)

from broker.layout import queue_lists  # noqa: E402
from common.keys import EndpointKeys  # noqa: E402
from common.store import connect  # noqa: E402
from simulator.answers import expected_answer  # noqa: E402
from simulator.config import SimConfig  # noqa: E402
from tests.harness import ROOT, Simulator, child_env, redis_url_or_own, wait_for  # noqa: E402

# Answers of 20-80 tokens, no reasoning: varied lengths, and few enough tokens per second
# (32 slots / 20 ms = 1,600 a second) that the simulator keeps its schedule on two cores.
ANSWER_CFG = SimConfig(min_answer_tokens=20, max_answer_tokens=80, reasoning_tokens=0)
ANSWERS = (
    "--min-answer-tokens", str(ANSWER_CFG.min_answer_tokens),
    "--max-answer-tokens", str(ANSWER_CFG.max_answer_tokens),
    "--reasoning-tokens", str(ANSWER_CFG.reasoning_tokens),
)  # fmt: skip


def pacing(slots: int, per_token: float) -> tuple[str, ...]:
    """Simulator options for a server with ``slots`` slots at ``per_token`` seconds a token."""
    return ("--max-num-seqs", str(slots), "--time-per-token", str(per_token), *ANSWERS)


def tokens(sim: Simulator) -> int:
    """Completion tokens the simulator generated so far."""
    return int(sim.stats()["tokens_generated"])


def run_eaglegen(stack: Stack, run: str, prompts: Path, timeout: float = 600) -> float:
    """Seconds from every prompt queued (endpoints held) to the last line on disk."""
    stack.collector(run, stack.dir / f"{run}.jsonl")
    stack.enqueue_held(run, prompts)
    started = time.monotonic()
    stack.wait_done(run, timeout)
    return time.monotonic() - started


def run_baseline(
    sim: Simulator, prompts: Path, concurrency: int, out: Path, stream: bool = False
) -> float:
    """The baseline script's own timing (first request to last line written)."""
    out.unlink(missing_ok=True)
    script = ROOT / "bench" / "baseline_asyncio.py"
    args = [
        *CLIENT,
        sys.executable,
        str(script),
        "--endpoint",
        sim.endpoint,
        "--input",
        str(prompts),
        "--out",
        str(out),
        "--concurrency",
        str(concurrency),
        *(["--stream"] if stream else []),
    ]
    done = subprocess.run(
        args, env=child_env(), capture_output=True, text=True, check=True, timeout=900
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def active(rows: list[Row]) -> list[Row]:
    """The samples taken while the server had work."""
    return [row for row in rows if row.running or row.waiting]


def mean_waiting(rows: list[Row]) -> float:
    """Mean of the server's waiting queue while it had work."""
    queued = [row.waiting for row in active(rows)]
    return round(statistics.fmean(queued), 2) if queued else 0.0


def busy_fraction(rows: list[Row]) -> float:
    """Mean of running / capacity while the server had work."""
    busy = [row.running / row.slots for row in active(rows)]
    return round(statistics.fmean(busy), 4) if busy else 0.0


def server_seconds(rows: list[Row]) -> float:
    """Server-side makespan: from the first poll that saw work to the last one (client start-up,
    enqueue and the collector's flush left out: the issue is the hand-off between requests)."""
    busy = active(rows)
    return round(busy[-1].at - busy[0].at, 2) if busy else 0.0


def full_phase(rows: list[Row], per_token: float) -> dict[str, Any]:
    """While every slot ran: the simulator's own token rate vs nominal, and the tail after it.

    Shows where time beyond the ideal goes when no client is to blame: the simulator shares
    the two cores and falls behind its schedule, and the last requests finish one by one.
    """
    full = [row for row in rows if row.running >= row.slots]
    if len(full) < 2:
        return {}
    first, last = full[0], full[-1]
    rate = (last.tokens - first.tokens) / (last.at - first.at)
    nominal = last.slots / per_token
    end = max((row.at for row in active(rows)), default=last.at)
    return {"sim_rate_vs_nominal": round(rate / nominal, 4), "tail_s": round(end - last.at, 2)}


# -- scenarios ---------------------------------------------------------------------------------


POLL = 0.05  # the simulator's state, polled this often in the utilisation runs


def utilisation(redis_url: str, work: Path, p: argparse.Namespace) -> dict[str, Any]:
    """EagleGen (cap S, then S + 10%) vs the ideal and vs the baseline at several concurrencies."""
    slots, per_token = p.slots, p.per_token
    prompts = write_prompts(work / "util.jsonl", p.samples, "util")
    caps = {"cap_S": slots, "cap_S_plus_10pct": slots + math.ceil(slots / 10)}
    with Stack(redis_url, work, "utilisation") as stack:
        sim = stack.simulator(*pacing(slots, per_token))
        stack.env["EAGLEGEN_ENDPOINTS"] = sim.endpoint
        runs = {label: _eaglegen_at(stack, sim, cap, prompts, p) for label, cap in caps.items()}
        ideal = runs["cap_S"].pop("tokens") * per_token / slots
        runs["cap_S_plus_10pct"].pop("tokens")
        lengths = answer_lengths(prompts)
        with_tail = fifo_makespan(lengths, slots, per_token)
        baseline = {}
        for concurrency in p.baseline_concurrency:
            with Sampler(sim, every=POLL) as sampler:
                seconds = run_baseline(sim, prompts, concurrency, work / "baseline.jsonl")
            baseline[str(concurrency)] = {
                "seconds": round(seconds, 2),
                "server_seconds": server_seconds(sampler.rows),
                "busy_slots": busy_fraction(sampler.rows),
                "mean_waiting": mean_waiting(sampler.rows),
                **full_phase(sampler.rows, per_token),
            }
    for run in (*runs.values(), *baseline.values()):
        run["vs_ideal"] = round(run["seconds"] / ideal, 4)
        run["vs_ideal_with_tail"] = round(run["seconds"] / with_tail, 4)
        run["server_vs_ideal"] = round(run["server_seconds"] / ideal, 4)
    best = min(v["seconds"] for v in baseline.values())
    return {
        "slots": slots,
        "time_per_token": per_token,
        "samples": p.samples,
        "ideal_seconds": round(ideal, 2),
        "ideal_with_tail_seconds": round(with_tail, 2),
        "answer_tokens_expected": sum(lengths),
        "eaglegen": runs,
        "baseline": baseline,
        "baseline_best_seconds": best,
        "eaglegen_vs_baseline_best": {k: round(v["seconds"] / best, 4) for k, v in runs.items()},
    }


def _eaglegen_at(
    stack: Stack, sim: Simulator, cap: int, prompts: Path, p: argparse.Namespace
) -> dict[str, Any]:
    workers = [
        stack.worker(cap // p.workers + 16, EAGLEGEN_MAX_INFLIGHT=str(cap))
        for _ in range(p.workers)
    ]
    stack.warm_up(stack.dir)
    before = tokens(sim)
    with Sampler(sim, every=POLL) as sampler:
        wall = run_eaglegen(stack, f"util-{cap}", prompts)
    for worker in workers:
        stack.stop(worker)
    return {
        "cap": cap,
        "seconds": round(wall, 2),
        "server_seconds": server_seconds(sampler.rows),
        "busy_slots": busy_fraction(sampler.rows),
        "mean_waiting": mean_waiting(sampler.rows),
        **full_phase(sampler.rows, p.per_token),
        "tokens": tokens(sim) - before,
    }


def answer_lengths(prompts: Path) -> list[int]:
    """Completion tokens the simulator gives each prompt, in file order (its answers are pure)."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    messages = ([{"role": "user", "content": row["prompt"]}] for row in rows)
    return [expected_answer(m, 2048, ANSWER_CFG).completion_tokens for m in messages]


def fifo_makespan(lengths: list[int], slots: int, per_token: float) -> float:
    """The best any client can do sending in this order: each request the moment a slot frees.

    Unlike total work / S it includes the tail, the last answers finishing one by one.
    """
    free = [0.0] * slots
    for length in lengths:
        heapq.heappush(free, heapq.heappop(free) + length * per_token)
    return max(free)


def ideal_piecewise(slot_seconds: float, phases: list[tuple[float, int]]) -> float:
    """Makespan of ``slot_seconds`` of work when capacity is ``phases`` [(from second, slots)]."""
    done, elapsed = 0.0, 0.0
    for i, (start, slots) in enumerate(phases):
        end = phases[i + 1][0] if i + 1 < len(phases) else float("inf")
        if done + slots * (end - start) >= slot_seconds:
            return start + (slot_seconds - done) / slots
        done, elapsed = done + slots * (end - start), end
    return elapsed


def adaptive(redis_url: str, work: Path, p: argparse.Namespace) -> dict[str, Any]:
    """No cap given, adaptive on; capacity changes at 30% and 65% of the samples."""
    first, second, third = p.adaptive_slots
    prompts = write_prompts(work / "adaptive.jsonl", p.samples, "adaptive")
    with Stack(redis_url, work, "adaptive") as stack:
        sim = stack.simulator(*pacing(first, p.per_token))
        stack.env["EAGLEGEN_ENDPOINTS"] = sim.endpoint
        for _ in range(p.workers):
            stack.worker(
                max(p.adaptive_slots) // p.workers + 16,
                EAGLEGEN_ADAPTIVE="true",
                EAGLEGEN_ADAPTIVE_INTERVAL=str(p.adaptive_interval),
            )
        stack.warm_up(work)
        before = tokens(sim)
        wall, changes, rows = _adaptive_run(stack, sim, prompts, p)
        slot_seconds = (tokens(sim) - before) * p.per_token
    phases = [(0.0, first), *zip(changes, (second, third), strict=True)]
    ideal = ideal_piecewise(slot_seconds, phases)
    return {
        "slots": list(p.adaptive_slots),
        "changed_at_s": [round(c, 2) for c in changes],
        "ideal_seconds": round(ideal, 2),
        "seconds": round(wall, 2),
        "vs_ideal": round(wall / ideal, 4),
        "busy_slots": busy_fraction(rows),
        "mean_waiting": round(statistics.fmean(row.waiting for row in rows), 2),
        "settled": _settling(rows, phases),
        "cap_trace": [(round(row.at, 1), row.cap) for row in rows[::5]],
    }


def _adaptive_run(
    stack: Stack, sim: Simulator, prompts: Path, p: argparse.Namespace
) -> tuple[float, list[float], list[Any]]:
    """Wall seconds, when capacity changed, and the sampled running/waiting/cap."""
    stack.collector("adaptive", stack.dir / "adaptive.jsonl")
    store = stack.store("adaptive")
    r = connect(stack.redis_url)
    cap_key = EndpointKeys(stack.prefix).cap(sim.endpoint)
    stack.enqueue_held("adaptive", prompts)
    changes = []
    with Sampler(sim, cap=lambda: int(r.get(cap_key) or 0)) as sampler:
        started = time.monotonic()
        for fraction, slots in ((0.30, p.adaptive_slots[1]), (0.65, p.adaptive_slots[2])):
            target = int(p.samples * fraction)
            wait_for(lambda t=target: store.counts().done >= t, 600, f"{target} samples done")
            sim.configure(max_num_seqs=slots)
            changes.append(time.monotonic() - started)
        stack.wait_done("adaptive", 600)
        wall = time.monotonic() - started
    return wall, changes, sampler.rows


def _settling(rows: list[Row], phases: list[tuple[float, int]]) -> list[dict[str, Any]]:
    """Per phase: seconds until the cap first sits at the capacity plus its small queue."""
    found = []
    for start, slots in phases:
        top = slots + math.ceil(slots * 0.1) + 1  # the controller's default headroom, one probe
        hits = (r.at for r in rows if r.at >= start and r.cap and slots <= r.cap <= top)
        hit = next(hits, None)
        found.append({"slots": slots, "seconds": None if hit is None else round(hit - start, 1)})
    return found


def overhead(redis_url: str, work: Path, p: argparse.Namespace) -> dict[str, Any]:
    """Samples/s with no model time at all, one token a chunk as vLLM streams: what the
    pipeline itself costs (CPU, Redis), against the baseline without and with streaming."""
    prompts = write_prompts(work / "overhead.jsonl", p.overhead_samples, "overhead")
    n = p.overhead_samples
    with Stack(redis_url, work, "overhead") as stack:
        sim = stack.simulator(
            "--max-num-seqs", "512", "--time-per-token", "0", "--fast-chunk-tokens", "1",
            *ANSWERS,
        )  # fmt: skip
        stack.env["EAGLEGEN_ENDPOINTS"] = sim.endpoint
        enqueue = _enqueue_rate(stack, work, p.enqueue_rows)  # before any worker takes them
        workers = [
            stack.worker(p.overhead_concurrency // p.workers, EAGLEGEN_MAX_INFLIGHT="512")
            for _ in range(p.workers)
        ]
        stack.warm_up(work)
        pids = [w.pid for w in workers]
        eaglegen, redis_use = _eaglegen_overhead(stack, sim, prompts, n, pids)
        baseline = {
            mode: _baseline_overhead(sim, prompts, p.overhead_concurrency, work, mode == "stream")
            for mode in ("plain", "stream")
        }
    return {
        "samples": n,
        "concurrency": p.overhead_concurrency,
        "tokens_per_chunk": 1,
        "eaglegen": _per_sample(eaglegen, n),
        "baseline": {mode: _per_sample(run, n) for mode, run in baseline.items()},
        "ratio": {
            mode: round(run["seconds"] / eaglegen["seconds"], 3) for mode, run in baseline.items()
        },
        "redis": redis_use,
        "enqueue": enqueue,
    }


def _eaglegen_overhead(
    stack: Stack, sim: Simulator, prompts: Path, n: int, worker_pids: list[int]
) -> tuple[dict[str, float], dict[str, Any]]:
    """Seconds, CPU and tokens of the whole path (enqueue -> worker -> Redis -> collector ->
    JSONL), and what Redis did meanwhile."""
    collector = stack.collector("overhead", stack.dir / "overhead.jsonl")
    pids = [*worker_pids, collector.pid]
    r = connect(stack.redis_url)
    redis_before, tokens_before = RedisUse.read(r), tokens(sim)
    cpu_before, own_before = sum(map(cpu_seconds, pids)), time.process_time()
    started = time.monotonic()
    stack.enqueue("overhead", prompts)
    polls = stack.wait_done("overhead", 600)
    wall = time.monotonic() - started
    cpu = sum(map(cpu_seconds, pids)) - cpu_before + time.process_time() - own_before
    redis_use = RedisUse.read(r).since(redis_before, polls, n)
    return {"seconds": wall, "cpu_s": cpu, "tokens": tokens(sim) - tokens_before}, redis_use


def _baseline_overhead(
    sim: Simulator, prompts: Path, concurrency: int, work: Path, stream: bool
) -> dict[str, float]:
    before, children = tokens(sim), resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = run_baseline(sim, prompts, concurrency, work / "overhead-base.jsonl", stream)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    return {"seconds": seconds, "cpu_s": cpu, "tokens": tokens(sim) - before}


def _per_sample(run: dict[str, float], n: int) -> dict[str, float]:
    return {
        "samples_per_s": round(n / run["seconds"], 1),
        "cpu_ms_per_sample": round(run["cpu_s"] / n * 1000, 2),
        "cpu_ms_per_1k_tokens": round(run["cpu_s"] / run["tokens"] * 1e6, 2),
        "tokens_per_sample": round(run["tokens"] / n, 1),
    }


def _enqueue_rate(stack: Stack, work: Path, rows: int) -> dict[str, float]:
    """Rows/s of ``enqueue`` into Redis with no worker running (the producer alone)."""
    source = write_prompts(work / "enqueue.jsonl", rows, "enqueue")
    started = time.monotonic()
    stack.enqueue("enqueue", source)
    seconds = time.monotonic() - started
    connect(stack.redis_url).delete(
        *stack.store("enqueue").keys.all_keys(), *queue_lists(stack.queue)
    )
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds)}


def memory(redis_url: str, work: Path, p: argparse.Namespace) -> dict[str, Any]:
    """Worker RSS with many requests in flight; Redis bytes per queued sample and result."""
    result: dict[str, Any] = {}
    with Stack(redis_url, work, "memory") as stack:
        result["redis_bytes_per_queued_sample"] = _queued_bytes(stack, work, 1000)
        slow = stack.simulator(
            "--max-num-seqs",
            "2048",
            "--time-per-token",
            "1",
            "--min-answer-tokens",
            "600",
            "--max-answer-tokens",
            "700",
        )
        stack.env["EAGLEGEN_ENDPOINTS"] = slow.endpoint
        result["worker_rss_mib"] = {str(n): _rss_at(stack, slow, work, n) for n in (128, 512)}
        fast = stack.simulator("--max-num-seqs", "256", "--time-per-token", "0", *ANSWERS)
        stack.env["EAGLEGEN_ENDPOINTS"] = fast.endpoint
        result["redis_bytes_per_stored_result"] = _result_bytes(stack, work, 500)
    return result


def _key_bytes(stack: Stack, run: str, extra: list[str]) -> int:
    r = connect(stack.redis_url)
    keys = [*stack.store(run).keys.all_keys(), *extra]
    return sum(int(r.memory_usage(k, samples=0) or 0) for k in keys)


def _queued_bytes(stack: Stack, work: Path, n: int) -> dict[str, Any]:
    prompts = write_prompts(work / "queued.jsonl", n, "queued")
    stack.enqueue("queued", prompts)
    # The messages wait in the list of their priority step (queue_lists), not in `queue` itself.
    total = _key_bytes(stack, "queued", queue_lists(stack.queue))
    prompt_bytes = statistics.fmean(len(line) for line in prompts.read_text().splitlines())
    connect(stack.redis_url).delete(
        *stack.store("queued").keys.all_keys(), *queue_lists(stack.queue)
    )
    return {"bytes": round(total / n), "prompt_json_bytes": round(prompt_bytes)}


def _rss_at(stack: Stack, sim: Simulator, work: Path, inflight: int) -> float:
    run = f"rss{inflight}"
    proc = stack.worker(inflight, EAGLEGEN_MAX_INFLIGHT="4096")
    stack.enqueue(run, write_prompts(work / f"{run}.jsonl", inflight, run))
    wait_for(lambda: sim.stats()["running"] >= inflight, 180, f"{inflight} requests in flight")
    time.sleep(2)  # measure after a few tokens streamed, not at the instant of admission
    rss = rss_mib(proc.pid)
    proc.send_signal(signal.SIGKILL)  # abandoning the run is the point: nothing to finish
    proc.wait()
    wait_for(lambda: sim.stats()["running"] == 0, 60, "aborted requests to end")
    return round(rss, 1)


def _result_bytes(stack: Stack, work: Path, n: int) -> dict[str, Any]:
    proc = stack.worker(32, EAGLEGEN_MAX_INFLIGHT="256")
    stack.enqueue("results", write_prompts(work / "results.jsonl", n, "results"))
    stack.wait_done("results", 300, written=False)
    keys = stack.store("results").keys
    r = connect(stack.redis_url)
    total = sum(int(r.memory_usage(k, samples=0) or 0) for k in (keys.results, keys.ready))
    record = statistics.fmean(len(v) for v in r.hvals(keys.results))
    proc.terminate()
    return {"bytes": round(total / n), "record_json_bytes": round(record)}


def scale(redis_url: str, work: Path, p: argparse.Namespace) -> dict[str, Any]:
    """1 worker x 1 endpoint, then 2 x 2, each endpoint capped below its server's capacity."""
    cap, n = p.scale_cap, p.scale_samples
    with Stack(redis_url, work, "scale") as stack:
        stack.env["EAGLEGEN_MAX_INFLIGHT"] = str(cap)
        sims = [stack.simulator(*pacing(cap * 4, p.scale_per_token))]
        one = _scale_run(stack, sims, 1, work, "one", n, p)
        stack.stop_all()  # fresh simulators: their peak counters start again
        sims = [stack.simulator(*pacing(cap * 4, p.scale_per_token)) for _ in range(2)]
        two = _scale_run(stack, sims, 2, work, "two", n, p)
    return {
        "cap": cap,
        "samples": n,
        "one_by_one": one,
        "two_by_two": two,
        "speedup": round(one["seconds"] / two["seconds"], 3),
        "cap_respected": all(peak <= cap for r in (one, two) for peak in r["peak_running"]),
    }


def _scale_run(
    stack: Stack,
    sims: list[Simulator],
    workers: int,
    work: Path,
    run: str,
    n: int,
    p: argparse.Namespace,
) -> dict[str, Any]:
    stack.env["EAGLEGEN_ENDPOINTS"] = ",".join(s.endpoint for s in sims)
    for _ in range(workers):
        stack.worker(p.scale_cap * 2)
    stack.warm_up(work)
    before = sum(tokens(s) for s in sims)
    wall = run_eaglegen(stack, run, write_prompts(work / f"{run}.jsonl", n, run))
    slot_seconds = (sum(tokens(s) for s in sims) - before) * p.scale_per_token
    ideal = slot_seconds / (p.scale_cap * len(sims))
    return {
        "workers": workers,
        "endpoints": len(sims),
        "seconds": round(wall, 2),
        "vs_ideal": round(wall / ideal, 4),
        "samples_per_s": round(n / wall, 1),
        "peak_running": [s.stats()["peak_running"] for s in sims],
    }


# -- report ------------------------------------------------------------------------------------


def summary(results: dict[str, Any]) -> str:
    """The Markdown summary of one run."""
    lines = [
        f"capacity benchmarks, {results['started']} ({results['machine']}, load "
        f"{results['load_before'][0]:.1f} -> {results['load_after'][0]:.1f})",
        "",
    ]
    for name, render in RENDER.items():
        if name in results:
            lines += render(results[name])
    return "\n".join(lines)


def _utilisation_lines(u: dict[str, Any]) -> list[str]:
    lines = [
        f"utilisation: S={u['slots']}, {u['time_per_token'] * 1000:.0f} ms/token, "
        f"{u['samples']} samples, ideal {u['ideal_seconds']} s (with the tail "
        f"{u['ideal_with_tail_seconds']} s)",
        "",
        "| run | wall s | vs ideal | vs ideal with tail | server-side s | server-side vs ideal "
        "| slots busy | mean waiting | sim rate while full | tail s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    named = [(f"EagleGen cap {run['cap']}", run) for run in u["eaglegen"].values()]
    named += [(f"baseline c={c}", run) for c, run in u["baseline"].items()]
    for name, run in named:
        lines.append(
            f"| {name} | {run['seconds']} | {_pct(run['vs_ideal'])} "
            f"| {_pct(run['vs_ideal_with_tail'])} | {run['server_seconds']} "
            f"| {_pct(run['server_vs_ideal'])} | {run['busy_slots']:.1%} "
            f"| {run['mean_waiting']} | {run.get('sim_rate_vs_nominal', 0):.1%} "
            f"| {run.get('tail_s', '-')} |"
        )
    ratios = ", ".join(f"{k}: {v}" for k, v in u["eaglegen_vs_baseline_best"].items())
    return [*lines, "", f"EagleGen / best baseline: {ratios}", ""]


def _adaptive_lines(a: dict[str, Any]) -> list[str]:
    return [
        f"adaptive: capacity {a['slots']} (changed at {a['changed_at_s']} s); ideal "
        f"{a['ideal_seconds']} s; EagleGen {a['seconds']} s ({_pct(a['vs_ideal'])}); slots "
        f"busy {a['busy_slots']:.1%}; mean waiting {a['mean_waiting']}; cap settled after "
        + ", ".join(f"{x['seconds']} s (S={x['slots']})" for x in a["settled"]),
        "",
    ]


def _overhead_lines(o: dict[str, Any]) -> list[str]:
    runs = [("EagleGen", o["eaglegen"]), ("baseline, not streaming", o["baseline"]["plain"]),
            ("baseline, streaming", o["baseline"]["stream"])]  # fmt: skip
    r, e = o["redis"], o["enqueue"]
    return [
        f"overhead: zero latency, {o['samples']} samples, {o['tokens_per_chunk']} token a "
        f"chunk, {o['concurrency']} at once; EagleGen / baseline samples/s: "
        f"{o['ratio']['plain']} (not streaming), {o['ratio']['stream']} (streaming)",
        "",
        "| run | samples/s | CPU ms per sample | CPU ms per 1,000 tokens |",
        "|---|---|---|---|",
        *(
            f"| {name} | {run['samples_per_s']} | {run['cpu_ms_per_sample']} "
            f"| {run['cpu_ms_per_1k_tokens']} |"
            for name, run in runs
        ),
        "",
        f"Redis per sample: {r['commands_per_sample']} commands, {r['reads_per_sample']} read "
        f"events (round trips), {r['cpu_ms_per_sample']} ms CPU: one Redis core tops out "
        f"near {r['one_redis_ceiling_samples_per_s']} samples/s ({r['note']})",
        f"enqueue: {e['rows_per_s']} rows/s ({e['rows']} rows, no worker running)",
        "",
    ]


def _memory_lines(m: dict[str, Any]) -> list[str]:
    q, r = m["redis_bytes_per_queued_sample"], m["redis_bytes_per_stored_result"]
    return [
        f"memory: worker RSS {m['worker_rss_mib']} MiB by requests in flight; Redis "
        f"{q['bytes']} B per queued sample ({q['prompt_json_bytes']} B prompt row), "
        f"{r['bytes']} B per stored result ({r['record_json_bytes']} B record)",
        "",
    ]


def _scale_lines(s: dict[str, Any]) -> list[str]:
    one, two = s["one_by_one"], s["two_by_two"]
    return [
        f"scale: cap {s['cap']} per endpoint; 1x1 {one['seconds']} s "
        f"({one['samples_per_s']} samples/s, peak {one['peak_running']}); 2x2 "
        f"{two['seconds']} s ({two['samples_per_s']} samples/s, peaks "
        f"{two['peak_running']}); speed-up {s['speedup']}; cap respected: "
        f"{s['cap_respected']}",
        "",
    ]


RENDER = {
    "utilisation": _utilisation_lines,
    "adaptive": _adaptive_lines,
    "overhead": _overhead_lines,
    "memory": _memory_lines,
    "scale": _scale_lines,
}


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


SCENARIOS = {
    "utilisation": utilisation,
    "adaptive": adaptive,
    "overhead": overhead,
    "memory": memory,
    "scale": scale,
}


def parse_args() -> argparse.Namespace:
    """Command line: which scenarios, and their sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("EAGLEGEN_BENCH_REDIS_URL"),
        help="a Redis to use (default: one of its own, on a free port)",
    )
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--samples", type=int, default=1000)
    # One worker process per core, as `make up` runs them: the GIL caps what one process streams.
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--per-token", type=float, default=0.02)
    parser.add_argument("--baseline-concurrency", type=int, nargs="*", default=[32, 64, 128])
    parser.add_argument("--adaptive-slots", type=int, nargs=3, default=[24, 48, 32])
    parser.add_argument("--adaptive-interval", type=float, default=0.5)
    parser.add_argument("--overhead-samples", type=int, default=1000)
    parser.add_argument("--overhead-concurrency", type=int, default=64)
    parser.add_argument("--enqueue-rows", type=int, default=5000)
    parser.add_argument("--scale-cap", type=int, default=16)
    parser.add_argument("--scale-samples", type=int, default=320)
    parser.add_argument("--scale-per-token", type=float, default=0.02)
    return parser.parse_args()


def main() -> None:
    """Run the chosen scenarios one after the other; write JSON, print Markdown."""
    p = parse_args()
    p.redis_url = redis_url_or_own(p.redis_url)
    work = work_dir("bench")
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        "load_before": os.getloadavg(),
    }
    for name in p.only:
        began = time.monotonic()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results[name] = SCENARIOS[name](p.redis_url, work, p)
        results[name]["bench_seconds"] = round(time.monotonic() - began, 1)
        print(f"[bench] {name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    results["load_after"] = os.getloadavg()
    path = save_results("capacity", results)
    print(summary(results))
    print(f"\nfull results: {path}")
    shutil.rmtree(work)  # logs and JSONL of the scenarios; kept when a scenario fails


if __name__ == "__main__":
    main()
