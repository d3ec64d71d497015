"""Run integrity with real processes: workers paused past their leases, permanent failures
under a tiny lease, several pools on several queues, two models, a producer racing retire."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from common.models import GenParams, Sample, SourceRef
from common.store import RunStore
from simulator.answers import prompt_key
from tests.harness import free_port, wait_for
from tests.stack import Stack

pytestmark = pytest.mark.faults  # make test-faults


def _prompts(tmp: Path, n: int, turns: int = 1, name: str = "p.jsonl") -> Path:
    path = tmp / name
    rows = [{"turns": [f"question {i} part {t}" for t in range(turns)]} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _sample(sample_id: str) -> Sample:
    return Sample(
        id=sample_id, user_turns=[f"lost {sample_id}"],
        source=SourceRef(dataset="d", row=0, format="prompt"),
    )  # fmt: skip


def _one_history(record: dict) -> bool:
    """Whether every assistant turn of ``record`` was generated on the record's own earlier
    answers: the simulator starts each answer with the key of the messages it was asked."""
    messages: list[dict] = []
    for message in record["conversations"]:
        key = f"[{prompt_key(messages)}]"
        if message["role"] == "assistant" and not message["content"].startswith(key):
            return False
        messages.append({"role": message["role"], "content": message["content"]})
    return True


def test_300_immediate_permanent_failures_under_a_tiny_lease_are_all_recorded(
    stack: Stack, tmp_path
):
    # Every prompt is over the context window: an HTTP 400 at once, a permanent failure, the
    # lease released and a failure stored within milliseconds while the renewer runs every
    # 0.1 s (the window in which a late renewal re-took a released lease).
    stack.simulator("--max-model-len", "6")
    stack.env.update(EAGLEGEN_LEASE_TTL="0.3", EAGLEGEN_RECONCILE_INTERVAL="1")
    worker = stack.worker(concurrency=8)
    # Enqueued unchecked (no server at the producer's address), as chaos does: the over-long
    # prompts must reach the server.
    unchecked = {**stack.env, "EAGLEGEN_ENDPOINTS": f"http://127.0.0.1:{free_port()}/v1"}
    result = stack.procs.run(["enqueue", str(_prompts(tmp_path, 300))], unchecked)
    assert result.returncode == 0, result.stderr
    wait_for(lambda: stack.store.counts().failed == 300, 120, lambda: str(stack.store.counts()))
    counts = stack.store.counts()
    assert (counts.pending, counts.failed, counts.redeliveries) == (0, 300, 0)
    assert all(f.attempts == 1 for f in stack.store.failures().values())
    stack.procs.stop(worker)
    assert "not ours any more" not in stack.procs.logs(200_000)


def test_a_worker_paused_past_its_lease_leaves_every_record_one_history(stack: Stack, tmp_path):
    stack.simulator(
        "--vary-answers", "--time-per-token", "0.01", "--min-answer-tokens", "30",
        "--max-answer-tokens", "60", "--reasoning-tokens", "0",
    )  # fmt: skip
    stack.env.update(EAGLEGEN_LEASE_TTL="2", EAGLEGEN_RECONCILE_INTERVAL="1", EAGLEGEN_RESUME="off")
    paused = stack.worker(concurrency=4)
    stack.enqueue(_prompts(tmp_path, 8, turns=3), "--temperature", "0.8")
    wait_for(lambda: stack.store.counts().in_flight >= 4, 30, "the samples to start")
    paused.send_signal(signal.SIGSTOP)
    try:
        stack.worker(concurrency=4)  # takes the samples over once their leases expire
        wait_for(
            lambda: stack.store.counts().redeliveries >= 1, 60, lambda: str(stack.store.counts())
        )
        time.sleep(2)  # the paused worker's leases are all expired and taken over by now
    finally:
        paused.send_signal(signal.SIGCONT)  # it wakes up mid-generation, its leases gone
    stack.collector()
    stack.wait_complete(timeout=120)
    lines = stack.lines()
    assert sorted(r["id"] for r in lines) == sorted({r["id"] for r in lines}) and len(lines) == 8
    assert all(_one_history(r) for r in lines), [r["conversations"] for r in lines]
    # Nothing a paused worker wrote late is left behind for a finished sample.
    assert stack.store.r.hlen(stack.store.keys.prompts) == 0


def test_three_pools_on_three_queues_each_with_lost_messages_all_complete(stack: Stack, tmp_path):
    stack.simulator("--max-answer-tokens", "20", "--reasoning-tokens", "0")
    base = {**stack.env, "EAGLEGEN_LEASE_TTL": "2", "EAGLEGEN_RECONCILE_INTERVAL": "1"}
    pools = []
    for name in ("a", "b", "c"):
        env = {**base, "EAGLEGEN_QUEUE": f"{stack.env['EAGLEGEN_QUEUE']}-{name}",
               "EAGLEGEN_RUN": f"{stack.run_name}-{name}"}  # fmt: skip
        stack.procs.start(f"pool-{name}", ["worker", "--concurrency", "2"], env)
        pools.append((env, RunStore(stack.store.r, stack.settings.key_prefix, env["EAGLEGEN_RUN"])))
    wait_for(lambda: stack.procs.logs(200_000).count("ready.") >= 3, 60, "three pools")
    time.sleep(3)  # every pool's reconciler has passed (and kept its lock) by now
    for env, store in pools:
        # Samples stored and their messages lost (a publish that never reached Redis).
        store.ensure_params(GenParams(max_tokens=64), env["EAGLEGEN_QUEUE"])
        store.accept([_sample(f"{store.run}-{i}") for i in range(5)])
    started, took = time.monotonic(), {}

    def all_done() -> bool:
        for i, (_, store) in enumerate(pools):
            if i not in took and store.counts().pending == 0:
                took[i] = round(time.monotonic() - started, 1)
        return len(took) == 3

    # Two passes find a lost sample (no lease to wait out here), then a short generation; a
    # few seconds of slack for a loaded machine. With one lock for every queue, a pool needed
    # two passes of its own, won against the other pools.
    wait_for(all_done, 2 * 1 + 6, lambda: f"{took} {[s.counts() for _, s in pools]}")
    print(f"three pools complete after {took} s")
    assert all(store.counts().done == 5 for _, store in pools)


def test_an_endpoint_serving_another_model_is_refused_and_every_turn_names_the_runs_model(
    stack: Stack, tmp_path
):
    from tests.harness import start_simulator

    first = start_simulator(stack.procs, "--model-name", "model-a", "--max-answer-tokens", "20")
    second = start_simulator(stack.procs, "--model-name", "model-b", "--max-answer-tokens", "20")
    stack.env["EAGLEGEN_ENDPOINTS"] = f"{first.endpoint},{second.endpoint}"
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 20, turns=2))
    stack.wait_complete(timeout=120)
    pinned = stack.store.pinned_model()
    assert pinned in ("model-a", "model-b")
    models = {t["model"] for r in stack.lines() for t in r["generation"]["turns"]}
    assert models == {pinned} and len(stack.lines()) == 20
    refused = stack.store.refused_endpoints()
    other = second.endpoint if pinned == "model-a" else first.endpoint
    assert list(refused) == [other]
    status = stack.procs.run(["status", "--json"], stack.env)
    assert json.loads(status.stdout)["refused_endpoints"] == refused
    assert f"endpoint {other} refused for run" in stack.procs.logs(200_000)


def test_retire_refuses_a_run_a_producer_feeds_and_once_forced_nothing_lands(
    stack: Stack, tmp_path
):
    stack.simulator("--time-per-token", "0.02", "--max-answer-tokens", "20")
    stack.worker(concurrency=1)
    producer = stack.procs.start(
        "producer", ["enqueue", str(_prompts(tmp_path, 40)), "--max-pending", "1"], stack.env
    )
    wait_for(lambda: stack.store.counts().done >= 2, 60, lambda: str(stack.store.counts()))
    refused = stack.procs.run(["runs", "retire", stack.run_name], stack.env)
    assert refused.returncode == 1 and "still being fed by a producer" in refused.stderr
    forced = stack.procs.run(["runs", "retire", stack.run_name, "--force"], stack.env)
    assert forced.returncode == 0, forced.stderr
    assert producer.wait(timeout=30) != 0  # the producer is refused, not silently feeding
    time.sleep(2)  # what a worker or producer might still write would be here by now
    pattern = f"{stack.settings.key_prefix}:{{{stack.run_name}}}:*"
    left = [k for k in stack.store.r.scan_iter(match=pattern) if stack.store.r.ttl(k) == -1]
    assert left == [stack.store.keys.retired]
    collect = stack.procs.run(["collect", "--out", str(stack.out), "--once"], stack.env)
    assert collect.returncode != 0 and "retired" in collect.stderr
    assert not stack.store.r.exists(stack.store.keys.collector_lock)
    summary = stack.store.retired_summary()
    assert summary is not None and summary["written"] == len(stack.lines()) == 0
