"""Long greedy answers on real vLLM: a killed worker's turns continue exactly, a paused
worker's streams are aborted, and what the server generates beyond the output is measured.

The tier's tiny model ends every answer after its planted 27-token path; here a copy of it
whose end-of-sequence token can never win the argmax (its unembedding row zeroed, and
``<|endoftext|>`` named as end of sequence instead of ``<|im_end|>``) answers to
``max_tokens``: 1,800-token turns, greedy, as the issue's measurements used. The server runs
with ``--enable-scale-out`` (its abort route) and two sequences, so the worker keeps up with
what it reads. Waste = (tokens the server generated - tokens in the output) / tokens in the
output, from vLLM's own ``generation_tokens_total``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT, wait_for
from tests.stack import Stack
from tests.vllm.server import (
    MODEL_DIR,
    VENV,
    Server,
    engine_behind_api_server,
    report,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

SOURCE = str(ROOT / "data" / "vicuna_bench_question.jsonl")
SAMPLES, MAX_TOKENS = 8, 1800
# Greedy: the server's own sampling could still draw the end-of-sequence token.
GREEDY = ("--max-tokens", str(MAX_TOKENS), "--temperature", "0")
ENQUEUE = (SOURCE, "--limit", str(SAMPLES), *GREEDY)
SHORT_LEASE = {"EAGLEGEN_LEASE_TTL": "5", "EAGLEGEN_RECONCILE_INTERVAL": "2"}
ENDLESS = """
import json, shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst)
weights = load_file(dst / "model.safetensors")
weights["lm_head.weight"][0] = 0.0  # a logit of 0: never the max of ~2,000 random ones
save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
for name, field, value in (("config.json", "eos_token_id", 0),
                           ("generation_config.json", "eos_token_id", 0),
                           ("tokenizer_config.json", "eos_token", "<|endoftext|>")):
    data = json.loads((dst / name).read_text())
    data[field] = value
    (dst / name).write_text(json.dumps(data))
"""


@pytest.fixture(scope="module")
def long_server(vllm_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("long")
    model = folder / "model"
    python = str(VENV / "bin" / "python")
    subprocess.run([python, "-c", ENDLESS, str(MODEL_DIR), str(model)], check=True, timeout=120)
    server = start_server(folder, "--enable-scale-out", "--max-num-seqs", "2", model=model)
    assert engine_behind_api_server(server), "no engine process under the API server"
    report(f"long-answer vLLM server (2 sequences, --enable-scale-out) ready in "
           f"{server.started_s} s")  # fmt: skip
    yield server
    stop_server(server)


def _turns(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r["generation"]["turns"][0] for r in records}


def _output_tokens(records: list[dict[str, Any]]) -> int:
    return sum(len(t["token_ids"]) for t in _turns(records).values())


def _fresh(stack: Stack, server: Server, tmp: Path, **env: str) -> Stack:
    tmp.mkdir(parents=True, exist_ok=True)
    run = Stack(stack.procs, stack.settings.redis_url, tmp)
    run.env.update(stack.env, EAGLEGEN_RUN=run.run_name, EAGLEGEN_QUEUE=f"q-{run.run_name}")
    run.env.update(SHORT_LEASE, EAGLEGEN_ENDPOINTS=server.endpoint, **env)
    return run


def _killed_run(stack: Stack, server: Server, tmp: Path, **env: str) -> dict[str, Any]:
    """SIGKILL the worker at 40% of the tokens, start another; the run's figures."""
    run = _fresh(stack, server, tmp, **env)
    before = server.generated()
    doomed = run.worker(concurrency=SAMPLES)
    collector = run.collector()
    run.enqueue(*ENQUEUE)
    at = before + 0.4 * SAMPLES * MAX_TOKENS
    wait_for(lambda: server.generated() >= at, 900, "40% of the tokens generated")
    run.procs.kill(doomed)
    killed_at = server.generated() - before
    read = run.store.counts().completion_tokens + sum(
        c.tokens for c in run.store.checkpoints().values()
    )  # what the worker had read, as far as Redis shows it (checkpoints every 32 tokens / 2 s)
    time.sleep(3)  # no worker: does the server go on with the dead one's requests?
    after_kill = server.generated() - before - killed_at
    worker = run.worker(concurrency=SAMPLES)
    run.wait_complete(900)
    for child in (worker, collector):
        run.procs.stop(child)
    records = run.lines()
    output = _output_tokens(records)
    generated = server.generated() - before
    return {
        "records": records, "output": output, "generated": generated,
        "waste": (generated - output) / output, "killed_at": killed_at, "read": read,
        "after_kill": after_kill,
    }  # fmt: skip


def test_a_killed_worker_on_long_answers_continues_exactly_and_wastes_little(
    stack: Stack, long_server: Server, tmp_path: Path
) -> None:
    unbroken = _fresh(stack, long_server, tmp_path / "unbroken")
    before = long_server.generated()
    worker, collector = unbroken.worker(concurrency=SAMPLES), unbroken.collector()
    unbroken.enqueue(*ENQUEUE)
    unbroken.wait_complete(900)
    for child in (worker, collector):
        unbroken.procs.stop(child)
    expected = _turns(unbroken.lines())
    assert all(t["finish_reason"] == "length" for t in expected.values())
    reference = long_server.generated() - before

    resumed = _killed_run(stack, long_server, tmp_path / "resumed")
    got = _turns(resumed["records"])
    assert {i: t["token_ids"] for i, t in got.items()} == {
        i: t["token_ids"] for i, t in expected.items()
    }
    off = _killed_run(stack, long_server, tmp_path / "off", EAGLEGEN_RESUME="off")
    for name, figures in (("EAGLEGEN_RESUME=auto", resumed), ("EAGLEGEN_RESUME=off", off)):
        report(
            f"SIGKILL at 40% ({name}): {figures['generated']:.0f} tokens generated for "
            f"{figures['output']} in the output, waste {figures['waste']:.2%}; at the kill the "
            f"server had generated {figures['killed_at']:.0f}, the worker had read >= "
            f"{figures['read']}, {figures['after_kill']:.0f} more in the 3 s after it"
        )
    report(f"unbroken run: {reference:.0f} tokens generated for {_output_tokens(unbroken.lines())}")
    # A killed worker's sockets close: vLLM stops its requests within an engine step or two.
    assert resumed["after_kill"] <= 64, resumed["after_kill"]
    assert resumed["waste"] <= 0.10, resumed["waste"]


def test_a_paused_workers_streams_are_aborted_within_a_lease_and_a_reconciler_pass(
    stack: Stack, long_server: Server, tmp_path: Path
) -> None:
    run = _fresh(stack, long_server, tmp_path / "paused")
    paused = run.worker(concurrency=2)
    run.enqueue(SOURCE, "--limit", "2", *GREEDY)
    requests = run.store.keys.requests
    wait_for(lambda: run.store.r.hlen(requests) == 2, 300, "both requests named")
    start = long_server.generated()
    wait_for(lambda: long_server.generated() >= start + 200, 300, "the streams under way")
    paused.send_signal(signal.SIGSTOP)  # its sockets stay open: the server would go on
    stopped_at = time.monotonic()
    try:
        time.sleep(5.5)  # the lease (5 s) expires; then one reconciler pass reaps it
        passed = run.procs.run(["reconcile"], run.env)
        assert passed.returncode == 0, passed.stderr
        grown = long_server.generated()
        time.sleep(3)
        assert long_server.generated() == grown  # nothing generates for the paused worker
        took = time.monotonic() - stopped_at - 3
        orphaned = grown - start
        status = json.loads(run.procs.run(["status", "--json"], run.env).stdout)
        assert status["goodput"]["aborted_requests"] == 2
    finally:
        paused.send_signal(signal.SIGCONT)
    # It wakes to vLLM's end of its aborted streams (finish_reason "abort", usage, [DONE]):
    # none of it is a record; its samples end whole, from their checkpoints or generated again
    # (which one is a race the worker may lose: its lease may be another message's by then).
    collector = run.collector()
    run.wait_complete(900)
    for child in (paused, collector):
        run.procs.stop(child)
    turns = _turns(run.lines())
    assert len(turns) == 2
    assert all((t["finish_reason"], len(t["token_ids"])) == ("length", MAX_TOKENS)
               for t in turns.values()), turns  # fmt: skip
    resumed = sum(1 for t in turns.values() if t.get("resumed_from_tokens"))
    report(f"paused worker: its 2 streams aborted {took:.1f} s after the pause (lease 5 s + "
           f"one reconcile pass); the server generated {orphaned:.0f} tokens for them after "
           f"they were under way, none after the abort (2 x {MAX_TOKENS} without it); "
           f"{resumed} of 2 went on from a checkpoint, both whole")  # fmt: skip
