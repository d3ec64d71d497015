"""`make chaos`: a bounded, self-stopping fault run on loopback, then a report.

Starts its own durable Redis (AOF, on a free port), a faulty simulator, several workers and a
collector; enqueues 2,000+ single-turn prompts (and a few over the context length); then every
10-20 s SIGKILLs a random worker and restarts it, SIGKILLs the collector twice and Redis once.
When the run completes (or the deadline passes) it stops everything and checks: nothing lost,
no duplicate line, every failure an over-long prompt, every answer belonging to its prompt, and
duplicate generations no more than the requests in flight at the kills.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.store import RunStore, connect  # noqa: E402
from simulator.answers import prompt_key  # noqa: E402
from tests.harness import Procs, free_port, start_redis, start_simulator  # noqa: E402

RUN = "chaos"
OVERLONG = 5


@dataclass
class Kill:
    what: str
    at: float
    held: list[str] = field(default_factory=list)
    recovered_s: float | None = None
    pid: int = 0


class Chaos:
    """The processes of one chaos run and the kills done to them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(args.dir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("*"):
            if old.is_file():
                old.unlink()
        (self.dir / "redis").mkdir(exist_ok=True)
        for old in (self.dir / "redis").rglob("*"):
            if old.is_file():
                old.unlink()
        self.redis_port = free_port()
        self.sim_port = free_port()
        self.url = f"redis://127.0.0.1:{self.redis_port}/0"
        env = {
            "EAGLEGEN_REDIS_URL": self.url,
            "EAGLEGEN_RUN": RUN,
            "EAGLEGEN_QUEUE": "chaos",
            "EAGLEGEN_ENDPOINTS": f"http://127.0.0.1:{self.sim_port}/v1",
            "EAGLEGEN_STALL_TIMEOUT": "3",
            "EAGLEGEN_LEASE_TTL": "6",
            "EAGLEGEN_RECONCILE_INTERVAL": "2",
            "EAGLEGEN_MAX_RETRIES": "15",
            "EAGLEGEN_BACKOFF_BASE": "0.2",
            "EAGLEGEN_BACKOFF_MAX": "2",
            "EAGLEGEN_SHUTDOWN_GRACE": "2",
        }
        # Own process groups: a SIGKILL takes whatever a child started, as a crash would.
        self.procs = Procs(self.dir, env, grace=30, own_group=True)
        self.roles: dict[str, subprocess.Popen[bytes]] = {}
        self.kills: list[Kill] = []
        self.rng = random.Random(args.seed)
        self.store: RunStore | None = None
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"chaos [{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    # -- processes ---------------------------------------------------------------------
    def start_redis(self) -> None:
        self.roles["redis"] = start_redis(
            self.procs, self.redis_port, self.dir / "redis",
            "--appendonly", "yes", "--appendfsync", "everysec",
            "--maxmemory", "1gb", "--maxmemory-policy", "noeviction", "--save", "",
            timeout=20,
        )  # fmt: skip

    def start_simulator(self) -> None:
        a = self.args
        self.roles["simulator"] = start_simulator(
            self.procs, "--time-per-token", str(a.tpt),
            "--max-num-seqs", "128", "--min-answer-tokens", "10", "--max-answer-tokens", "60",
            "--reasoning-tokens", "8", "--max-model-len", "600", "--p-500", "0.10",
            "--p-429", "0.05", "--p-stall", "0.03", "--p-disconnect", "0.02",
            "--seed", str(a.seed), "--log", str(self.dir / "sim-log.jsonl"),
            port=self.sim_port,
        ).proc  # fmt: skip

    def start_worker(self, i: int) -> None:
        args = ["worker", "--concurrency", str(self.args.concurrency), "--loglevel", "WARNING"]
        self.roles[f"worker#{i}"] = self.procs.start("worker", args)

    def start_collector(self) -> None:
        args = ["collect", "--out", str(self.dir / "out.jsonl")]
        self.roles["collector"] = self.procs.start("collector", args)

    def kill(self, name: str) -> subprocess.Popen[bytes]:
        proc = self.roles[name]
        self.procs.kill(proc)
        return proc

    def stop_all(self) -> None:
        """Every role, then Redis: stopping workers still hand their samples back to it."""
        self.procs.stop(*[p for name, p in self.roles.items() if name != "redis"])
        self.procs.stop(self.roles["redis"])

    # -- the run ---------------------------------------------------------------------------
    def prompts(self) -> Path:
        path = self.dir / "prompts.jsonl"
        rows = [{"prompt": f"chaos prompt {i}: explain topic {i % 97} briefly"}
                for i in range(self.args.samples)]  # fmt: skip
        rows += [{"prompt": f"over-long {i} " + "word " * 800} for i in range(OVERLONG)]
        self.rng.shuffle(rows)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    def run(self) -> dict[str, Any]:
        self.start_redis()
        self.store = RunStore(connect(self.url), "eaglegen", RUN)
        self.start_simulator()
        for i in range(self.args.workers):
            self.start_worker(i)
        self.start_collector()
        started = time.monotonic()
        enqueue = self.procs.run(["enqueue", str(self.prompts()), "--max-tokens", "200"])
        self.say(enqueue.stdout.strip())
        complete = self.chaos_loop(started)
        elapsed = time.monotonic() - started
        self.stop_all()
        return self.report(complete, elapsed)

    def chaos_loop(self, started: float) -> bool:
        assert self.store is not None
        next_worker_kill = started + self.rng.uniform(10, 20)
        plan = {"collector": [0.25, 0.6], "redis": [0.4]}
        deadline = started + self.args.deadline
        while time.monotonic() < deadline:
            counts = self._counts()
            if counts is not None and counts.complete and counts.total:
                return True
            progress = (counts.done + counts.failed) / max(counts.total, 1) if counts else 0.0
            for what, marks in plan.items():
                if marks and progress >= marks[0]:
                    marks.pop(0)
                    self.kill_and_restart(what)
            if time.monotonic() >= next_worker_kill:
                self.kill_worker()
                next_worker_kill = time.monotonic() + self.rng.uniform(10, 20)
            self.track_recovery()
            time.sleep(0.2)
        return False

    def _counts(self) -> Any:
        try:
            assert self.store is not None
            return self.store.counts()
        except Exception:
            return None  # Redis is down for a moment

    def kill_worker(self) -> None:
        i = self.rng.randrange(self.args.workers)
        pid = self.roles[f"worker#{i}"].pid
        held = self._held_by(pid)
        self.kill(f"worker#{i}")
        self.kills.append(Kill(f"worker#{i}", time.monotonic(), held, pid=pid))
        self.say(f"SIGKILL worker#{i} (pid {pid}) holding {len(held)} samples")
        self.start_worker(i)

    def _held_by(self, pid: int) -> list[str]:
        try:
            assert self.store is not None
            owners = self.store.r.hgetall(self.store.keys.lease_owner)
        except Exception:
            return []
        return [i for i, owner in owners.items() if f":{pid}:" in owner]

    def kill_and_restart(self, what: str) -> None:
        held = list(self._all_leased()) if what == "redis" else []
        self.kill(what)
        self.kills.append(Kill(what, time.monotonic(), held))
        self.say(f"SIGKILL {what}")
        if what == "redis":
            time.sleep(1.0)  # stay down a moment, as a crash would
            self.start_redis()
        else:
            self.start_collector()

    def _all_leased(self) -> set[str]:
        try:
            assert self.store is not None
            return self.store.leased_ids()
        except Exception:
            return set()

    def track_recovery(self) -> None:
        """For each worker kill: time until all it held are leased again or finished."""
        try:
            assert self.store is not None
            owners = self.store.r.hgetall(self.store.keys.lease_owner)
            pending = self.store.pending_ids()
        except Exception:
            return
        for kill in self.kills:
            if kill.recovered_s is not None or not kill.what.startswith("worker"):
                continue
            dead = f":{kill.pid}:"
            if all(i not in pending or dead not in owners.get(i, dead) for i in kill.held):
                kill.recovered_s = round(time.monotonic() - kill.at, 2)

    # -- the report --------------------------------------------------------------------------
    def report(self, complete: bool, elapsed: float) -> dict[str, Any]:
        self.start_redis()  # read the final state from the AOF
        store = RunStore(connect(self.url), "eaglegen", RUN)
        accepted = set(store.r.smembers(store.keys.accepted))
        failures = store.failures()
        lines = [json.loads(x) for x in (self.dir / "out.jsonl").read_text().splitlines()]
        ids = Counter(r["id"] for r in lines)
        generations = self._generations()
        in_flight_at_kills = sum(len(k.held) for k in self.kills)
        wasted = sum(n - 1 for n in generations.values() if n > 1)
        recoveries = [k.recovered_s for k in self.kills if k.recovered_s is not None and k.held]
        reasons = Counter(f"{f.kind}: {f.message.split(':')[-1].strip()[:60]}"
                          for f in failures.values())  # fmt: skip
        result = {
            "complete": complete, "wall_s": round(elapsed, 1), "accepted": len(accepted),
            "lines": len(lines), "duplicate_lines": sum(n - 1 for n in ids.values() if n > 1),
            "lost": len(accepted - set(ids) - set(failures)),
            "failed": len(failures), "failed_reasons": dict(reasons),
            "failed_not_overlong": sum(f.kind != "400" for f in failures.values()),
            "answers_not_matching_prompt": self._mismatched(lines),
            "generations": sum(generations.values()),
            "duplicate_generations": wasted, "in_flight_at_kills": in_flight_at_kills,
            "kills": [{"what": k.what, "held": len(k.held), "recovered_s": k.recovered_s}
                      for k in self.kills],
            "worker_kills": sum(k.what.startswith("worker") for k in self.kills),
            "kill_to_running_again_s": {
                "max": max(recoveries, default=None),
                "median": statistics.median(recoveries) if recoveries else None,
            },
        }  # fmt: skip
        store.r.close()
        self.procs.stop(self.roles["redis"])
        return result

    def _generations(self) -> Counter[str]:
        log = self.dir / "sim-log.jsonl"
        events = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        return Counter(e["key"] for e in events if e.get("event") == "completed")

    @staticmethod
    def _mismatched(lines: list[dict[str, Any]]) -> int:
        bad = 0
        for record in lines:
            user = next(m for m in record["conversations"] if m["role"] == "user")
            answer = next(m for m in record["conversations"] if m["role"] == "assistant")
            key = prompt_key([{"role": "user", "content": user["content"]}])
            bad += not answer["content"].startswith(f"[{key}]")
        return bad


def verdict(r: dict[str, Any]) -> list[str]:
    """The targets the run missed (empty when it passed)."""
    misses = []
    if not r["complete"]:
        misses.append("the run did not complete before the deadline")
    for key in ("lost", "duplicate_lines", "failed_not_overlong", "answers_not_matching_prompt"):
        if r[key]:
            misses.append(f"{key} = {r[key]}")
    if r["failed"] != OVERLONG:
        misses.append(f"{r['failed']} failed, expected the {OVERLONG} over-long prompts")
    if r["worker_kills"] < 4:
        misses.append(f"only {r['worker_kills']} worker kills: the run was too short to judge")
    if r["duplicate_generations"] > r["in_flight_at_kills"]:
        misses.append("more duplicate generations than requests in flight at the kills")
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--tpt", type=float, default=0.05, help="simulator seconds per token")
    parser.add_argument("--deadline", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", default=str(ROOT / ".eaglegen" / "chaos"))
    chaos = Chaos(parser.parse_args())
    try:
        result = chaos.run()
    finally:
        chaos.procs.kill_all()
    (chaos.dir / "report.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    misses = verdict(result)
    print("chaos: PASS" if not misses else "chaos: FAIL: " + "; ".join(misses))
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
