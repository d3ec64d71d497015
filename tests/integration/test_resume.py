"""Exact resume with real workers, Redis and simulators: a turn broken mid-stream (a dropped
connection, a SIGKILLed worker, a worker paused past its lease) continues from its checkpoint,
and its record equals that of an unbroken run of the same prompts.

Each test runs the same prompts through a second, fault-free pipeline (another run, queue and
simulator in the same Redis) as its reference; the simulator's answers depend on the prompt
and the answer-length options only, not on its pacing.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import ROOT, Child, Procs, free_port, start_simulator, wait_for
from tests.stack import Stack

PROMPTS = ROOT / "data" / "mt_bench_question.jsonl"  # two user turns each
FAST_RECOVERY = {"EAGLEGEN_LEASE_TTL": "3", "EAGLEGEN_RECONCILE_INTERVAL": "1"}
LONG = ("--min-answer-tokens", "200", "--max-answer-tokens", "240", "--reasoning-tokens", "0")


def _turns(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {r["id"]: r["generation"]["turns"] for r in records}


def _ids(records: list[dict[str, Any]]) -> dict[str, list[list[int]]]:
    """Per sample, every turn's prompt ids + completion ids: what a training row is made of."""
    return {
        sample_id: [t["prompt_token_ids"] + t["token_ids"] for t in turns]
        for sample_id, turns in _turns(records).items()
    }


def _texts(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {r["id"]: r["conversations"] for r in records}


def reference(
    procs: Procs, redis_url: str, tmp: Path, source: Path, *options: str, sim: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The records of an unbroken run of ``source``: no faults, no kills, no resume."""
    ref = Stack(procs, redis_url, tmp / "reference")
    (tmp / "reference").mkdir(exist_ok=True)
    ref.env["EAGLEGEN_ENDPOINTS"] = start_simulator(procs, *sim).endpoint
    ref.worker(concurrency=8)
    ref.collector()
    ref.enqueue(source, *options)
    ref.wait_complete()
    return ref.lines()


def _dropped_run(
    stack: Stack, limit: str, sim: tuple[str, ...], **worker_env: str
) -> tuple[str, Child]:
    """The bundled prompts through a simulator whose every first attempt drops mid-stream:
    its URL and the worker."""
    url = stack.simulator("--disconnect-first", "1", *sim)
    worker = stack.worker(concurrency=8, **worker_env)
    stack.collector()
    stack.enqueue(PROMPTS, "--limit", limit)
    stack.wait_complete()
    return url, worker


def _resumed_metric(text: str) -> float:
    """The worker's eaglegen_resumed_tokens_total, all endpoints."""
    samples = (s for f in text_string_to_metric_families(text) for s in f.samples)
    return sum(s.value for s in samples if s.name == "eaglegen_resumed_tokens_total")


def _prompts(tmp: Path, n: int) -> Path:
    path = tmp / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"tell me about {i}"}) + "\n" for i in range(n)))
    return path


def test_dropped_streams_continue_exactly_and_the_server_generates_each_token_once(
    stack: Stack, redis_url, tmp_path
):
    expected = reference(stack.procs, redis_url, tmp_path, PROMPTS, "--limit", "6")
    port = free_port()
    url, worker = _dropped_run(
        stack, "6", (), EAGLEGEN_CHECKPOINT_TOKENS="16", EAGLEGEN_METRICS_PORT=str(port)
    )
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    stack.procs.stop(worker)  # its last second of turn statistics is written as it stops
    records = stack.lines()

    assert _ids(records) == _ids(expected) and _texts(records) == _texts(expected)
    turns = [t for ts in _turns(records).values() for t in ts]
    assert len(turns) == 12 and all(t["resumed_from_tokens"] > 0 for t in turns)
    output = sum(len(t["token_ids"]) for t in turns)
    generated = _sim_generated(url)
    # Every turn broke once; only what was in flight at the break is generated twice.
    assert output <= generated <= output * 1.1, (generated, output)
    status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)
    assert status["goodput"]["resumed_turns"] == 12
    # Kept, so not wasted: at most a token past a break that carried no text (a cut just
    # after the opening <think>) is generated again.
    assert status["goodput"]["wasted_tokens"] <= 12
    assert status["goodput"]["resumed_tokens"] == sum(t["resumed_from_tokens"] for t in turns)
    assert _resumed_metric(metrics) == status["goodput"]["resumed_tokens"]


def _started_again(stack: Stack, records: list[dict[str, Any]], expected: list[dict[str, Any]]):
    """Every broken turn was generated again whole, none joined to its partial."""
    assert _texts(records) == _texts(expected)
    turns = [t for ts in _turns(records).values() for t in ts]
    assert turns and all(t["resumed_from_tokens"] == 0 for t in turns)
    discarded = [t["discarded_tokens"] for t in turns if t.get("discarded_tokens")]
    assert discarded, "no broken turn's checkpoint was set aside"

    def goodput() -> dict[str, Any]:
        return json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)["goodput"]

    # Workers flush their turn statistics every few seconds: the records may land first.
    wait_for(
        lambda: goodput()["discarded_checkpoints"] >= len(discarded),
        30,
        lambda: f"status to count {len(discarded)} discarded checkpoints: {goodput()}",
        every=0.5,
    )
    assert goodput()["discarded_checkpoints"] == len(discarded)
    assert goodput()["wasted_tokens"] >= sum(discarded)


def test_without_token_ids_a_dropped_turn_is_generated_again_not_continued_unproven(
    stack: Stack, redis_url, tmp_path
):
    # A server that echoes no prompt ids cannot prove it continues a partial answer.
    expected = reference(
        stack.procs, redis_url, tmp_path, PROMPTS, "--limit", "4", sim=("--no-token-ids",)
    )
    _dropped_run(stack, "4", ("--no-token-ids",), EAGLEGEN_CHECKPOINT_TOKENS="16")
    records = stack.lines()
    _started_again(stack, records, expected)
    assert not any("token_ids" in t for ts in _turns(records).values() for t in ts)


def test_a_server_that_ignores_continuations_gets_no_record_corrupted(
    stack: Stack, redis_url, tmp_path
):
    # Every first attempt drops mid-stream; the server then answers each continuation request
    # (a token-id prompt, continue_final_message) afresh. Joined, that would be "partial +
    # whole new answer"; the records must equal an unbroken run's.
    expected = reference(stack.procs, redis_url, tmp_path, PROMPTS, "--limit", "4")
    _dropped_run(stack, "4", ("--ignore-continuations",), EAGLEGEN_CHECKPOINT_TOKENS="16")
    records = stack.lines()
    _started_again(stack, records, expected)
    assert _ids(records) == _ids(expected)


def test_a_checkpoint_a_server_cannot_continue_goes_to_one_that_can(
    stack: Stack, redis_url, tmp_path
):
    # A drops every first attempt and answers continuations afresh; B continues them. Once a
    # worker has learned that of A, the checkpoints of A's broken turns continue on B, exactly,
    # rather than go back to A (their prefix's server) and start again.
    source = _prompts(tmp_path, 16)
    expected = reference(stack.procs, redis_url, tmp_path, source)
    a = start_simulator(stack.procs, "--disconnect-first", "1", "--ignore-continuations")
    b = start_simulator(stack.procs)
    stack.env["EAGLEGEN_ENDPOINTS"] = f"{a.endpoint},{b.endpoint}"
    stack.worker(concurrency=1, EAGLEGEN_CHECKPOINT_TOKENS="16")
    stack.collector()
    stack.enqueue(source)
    stack.wait_complete()
    records = stack.lines()

    assert _ids(records) == _ids(expected) and _texts(records) == _texts(expected)
    turns = [t for ts in _turns(records).values() for t in ts]
    moved = [t for t in turns if t["resumed_from_tokens"] and t["endpoint"] == b.endpoint]
    assert moved, [(t["endpoint"], t["resumed_from_tokens"]) for t in turns]
    # Only A breaks turns, and A continues none: every resumed turn was continued on B.
    assert all(t["endpoint"] == b.endpoint for t in turns if t["resumed_from_tokens"])


def test_resume_off_generates_a_broken_turn_again_from_the_start(stack: Stack, redis_url, tmp_path):
    expected = reference(stack.procs, redis_url, tmp_path, PROMPTS, "--limit", "4")
    url, _ = _dropped_run(stack, "4", (), EAGLEGEN_RESUME="off")
    records = stack.lines()

    assert _ids(records) == _ids(expected)
    turns = [t for ts in _turns(records).values() for t in ts]
    assert all(t["resumed_from_tokens"] == 0 for t in turns)
    output = sum(len(t["token_ids"]) for t in turns)
    assert _sim_generated(url) > output  # the broken parts were generated again
    assert not any(stack.store.r.hkeys(stack.store.keys.prompts))


def test_a_killed_workers_turns_continue_from_their_checkpoints(stack: Stack, redis_url, tmp_path):
    source = _prompts(tmp_path, 4)
    expected = reference(stack.procs, redis_url, tmp_path, source, sim=LONG)
    stack.env.update(FAST_RECOVERY, EAGLEGEN_CHECKPOINT_TOKENS="32")
    url = stack.simulator("--time-per-token", "0.03", *LONG)
    doomed = stack.worker(concurrency=4)
    stack.enqueue(source)
    wait_for(lambda: stack.store.counts().in_flight == 4, 30, "the worker to lease 4 samples")
    ids = sorted(stack.store.pending_ids())

    def checkpointed() -> bool:
        found = [stack.store.checkpoint(i) for i in ids]
        return all(c is not None and c.tokens >= 64 for c in found)

    wait_for(checkpointed, 60, "a checkpoint of every sample")
    stack.procs.kill(doomed)
    kept = {i: stack.store.checkpoint(i) for i in ids}
    assert all(c is not None and c.token_ids for c in kept.values())
    stack.worker(concurrency=4)  # the reconciler gives it the dead worker's samples
    stack.collector()
    stack.wait_complete()
    records = stack.lines()

    assert _ids(records) == _ids(expected) and _texts(records) == _texts(expected)
    for sample_id, [turn] in _turns(records).items():
        saved = kept[sample_id]
        assert saved is not None and turn["resumed_from_tokens"] >= saved.tokens
        assert turn["token_ids"][: saved.tokens] == saved.token_ids
    output = sum(len(t["token_ids"]) for ts in _turns(records).values() for t in ts)
    # Lost to the kill: only what streamed after each sample's last checkpoint (< 32 + a read).
    assert _sim_generated(url) <= output + 4 * 64


def test_a_stopping_workers_turns_are_handed_back_with_their_break_points(
    stack: Stack, redis_url, tmp_path
):
    source = _prompts(tmp_path, 3)
    expected = reference(stack.procs, redis_url, tmp_path, source, sim=LONG)
    # No periodic checkpoints: what is continued is what the hand-back saved.
    stack.env.update(EAGLEGEN_CHECKPOINT_TOKENS="0", EAGLEGEN_CHECKPOINT_SECONDS="3600")
    url = stack.simulator("--time-per-token", "0.03", *LONG)
    stopping = stack.worker(concurrency=3, EAGLEGEN_SHUTDOWN_GRACE="1")
    stack.enqueue(source)
    wait_for(lambda: stack.store.counts().in_flight == 3, 30, "the worker to lease 3 samples")
    ids = sorted(stack.store.pending_ids())
    wait_for(lambda: _sim_generated(url) >= 3 * 40, 30, "40 tokens of each answer")
    stack.procs.stop(stopping)  # SIGTERM: 1 s of grace, then the samples are handed back
    kept = {i: stack.store.checkpoint(i) for i in ids}
    assert all(c is not None and c.tokens >= 40 for c in kept.values()), kept
    stack.worker(concurrency=3)
    stack.collector()
    stack.wait_complete()
    records = stack.lines()

    assert _ids(records) == _ids(expected)
    for sample_id, [turn] in _turns(records).items():
        saved = kept[sample_id]
        assert saved is not None and turn["resumed_from_tokens"] == saved.tokens
    output = sum(len(t["token_ids"]) for ts in _turns(records).values() for t in ts)
    assert _sim_generated(url) <= output + 3 * 2  # at most a token or two past each break


def test_a_worker_paused_past_its_lease_cannot_overwrite_the_new_holders_checkpoint(
    stack: Stack, redis_url, tmp_path
):
    source = _prompts(tmp_path, 1)
    expected = reference(stack.procs, redis_url, tmp_path, source, sim=LONG)
    stack.env.update(EAGLEGEN_CHECKPOINT_TOKENS="16")
    stack.simulator("--time-per-token", "0.03", *LONG)
    log = tmp_path / f"worker-{len(stack.procs.procs)}.log"
    # A long lease, renewed every 40 s: when it wakes, its stream reader runs before its
    # renewer could learn that the sample was taken over, so its next checkpoint meets the fence.
    paused = stack.worker(
        concurrency=1, EAGLEGEN_LEASE_TTL="120", EAGLEGEN_RECONCILE_INTERVAL="600"
    )
    stack.enqueue(source)
    [sample_id] = stack.store.pending_ids()
    wait_for(lambda: stack.store.checkpoint(sample_id) is not None, 30, "a first checkpoint")
    paused.send_signal(signal.SIGSTOP)
    try:
        # Paused past its lease: a lease's expiry is its score (Redis clock); this stands for
        # the 120 s without waiting them out.
        stack.store.r.zadd(stack.store.keys.leases, {sample_id: 0})
        stack.worker(concurrency=1, EAGLEGEN_LEASE_TTL="2", EAGLEGEN_RECONCILE_INTERVAL="1")

        def new_holders() -> bool:
            ckpt = stack.store.checkpoint(sample_id)
            return ckpt is not None and ckpt.resumed_from_tokens > 0

        wait_for(new_holders, 60, "the new holder's checkpoint")
    finally:
        paused.send_signal(signal.SIGCONT)
    # The paused worker wakes with a stream's worth of unread tokens and a checkpoint due. Its
    # checkpoints started from 0 tokens; the new holder's continue one (resumed_from > 0).
    seen = []

    def finished_or_watched() -> bool:
        ckpt = stack.store.checkpoint(sample_id)
        if ckpt is not None:
            seen.append(ckpt.resumed_from_tokens)
        return ckpt is None

    wait_for(finished_or_watched, 60, "the sample to finish", every=0.02)
    assert seen and all(n > 0 for n in seen)
    wait_for(lambda: "refused: the lease is not ours" in log.read_text(), 30, "the refusal")
    stack.collector()
    stack.wait_complete()
    assert _ids(stack.lines()) == _ids(expected)


def _sim_generated(url: str) -> int:
    """Tokens the simulator has generated, streams in progress included."""
    import httpx

    stats = httpx.get(f"{url}/sim/stats", timeout=5).json()
    return int(stats["tokens_generated"])


pytestmark = pytest.mark.integration
