"""The whole path, producer -> Redis -> Celery worker processes -> collector -> JSONL."""

from __future__ import annotations

import json
import signal
from collections import Counter

import pytest

from simulator.answers import prompt_key
from tests.harness import ROOT, wait_for
from tests.stack import Stack

DATA = ROOT / "data"


def _history_of(record: dict, turn: int) -> list[dict]:
    """The messages the server saw for assistant turn ``turn`` of a record."""
    messages, seen = [], 0
    for message in record["conversations"]:
        if message["role"] == "assistant":
            if seen == turn:
                return messages
            seen += 1
        messages.append({"role": message["role"], "content": message["content"]})
    raise AssertionError("turn not found")


def _assert_answers_belong_to_their_prompts(records: list[dict]) -> None:
    for record in records:
        assistants = [m for m in record["conversations"] if m["role"] == "assistant"]
        for i, message in enumerate(assistants):
            key = prompt_key(_history_of(record, i))
            assert message["content"].startswith(f"[{key}]"), record["id"]


def test_the_bundled_prompts_are_answered_exactly_once(stack: Stack):
    stack.simulator("--max-num-seqs", "16")
    stack.worker(concurrency=16)
    stack.collector()
    first = stack.enqueue(DATA / "mt_bench_question.jsonl")
    second = stack.enqueue(DATA / "vicuna_bench_question.jsonl")
    assert "enqueued 80, already present 0, duplicates 0, invalid 0" in first.stdout
    assert "enqueued 80," in second.stdout
    stack.wait_complete()
    records = stack.lines()
    assert len(records) == 160
    assert len({r["id"] for r in records}) == 160
    turns = Counter(sum(m["role"] == "assistant" for m in r["conversations"]) for r in records)
    assert turns == {2: 80, 1: 80}
    assert all(r["conversations"][1]["reasoning_content"] for r in records)
    _assert_answers_belong_to_their_prompts(records)
    counts = stack.store.counts()
    assert (counts.total, counts.done, counts.failed, counts.written) == (160, 160, 0, 160)


def test_a_transient_fault_is_retried_until_it_succeeds(stack: Stack, tmp_path):
    stack.simulator("--fail-first", "1")
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(6)))
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(source)
    stack.wait_complete()
    records = stack.lines()
    assert len(records) == 6
    assert all(r["generation"]["attempts"] == 2 for r in records)
    assert stack.store.counts().retries == 6


def test_a_permanent_fault_lands_in_failed_without_retries(stack: Stack, tmp_path):
    stack.simulator("--max-model-len", "200")
    source = tmp_path / "p.jsonl"
    rows = [{"prompt": "short question"}, {"prompt": "word " * 500}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stack.worker(concurrency=2)
    stack.collector()
    stack.enqueue_unchecked(source, "--max-tokens", "64")  # the long prompt meets a 400
    stack.wait_complete()
    counts = stack.store.counts()
    assert (counts.done, counts.failed, counts.retries) == (1, 1, 0)
    [failure] = stack.store.failures().values()
    assert failure.kind == "400" and "maximum context length" in failure.message
    assert failure.attempts == 1
    status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)
    assert {k: status[k] for k in ("total", "done", "failed", "written")} == {
        "total": 2,
        "done": 1,
        "failed": 1,
        "written": 1,
    }


def test_a_collector_killed_mid_run_leaves_exactly_one_line_per_sample(stack: Stack):
    stack.simulator("--time-per-token", "0.002", "--max-num-seqs", "8")
    stack.worker(concurrency=8)
    collector = stack.collector()
    stack.enqueue(DATA / "vicuna_bench_question.jsonl")
    wait_for(lambda: 5 <= len(stack.lines()) < 80, 60, "some lines to be written")
    collector.send_signal(signal.SIGKILL)
    collector.wait()
    with stack.out.open("a") as fh:  # as if the kill had landed in the middle of a write
        fh.write('{"schema": 1, "id": "half-writ')
    stack.collector()
    stack.wait_complete()
    ids = [r["id"] for r in stack.lines()]
    assert len(ids) == 80 and len(set(ids)) == 80
    assert stack.store.counts().written == 80


def test_enqueue_again_adds_only_rows_not_yet_in_the_run(stack: Stack):
    source = DATA / "vicuna_bench_question.jsonl"
    assert "enqueued 10, already present 0" in stack.enqueue(source, "--limit", "10").stdout
    assert "enqueued 30, already present 10" in stack.enqueue(source, "--limit", "40").stdout
    assert "enqueued 0, already present 40" in stack.enqueue(source, "--limit", "40").stdout
    assert stack.store.counts().total == 40
    queue_len = stack.queued()
    assert queue_len == 40  # one message per sample, never a second one


def test_a_run_refuses_other_generation_parameters(stack: Stack):
    source = DATA / "vicuna_bench_question.jsonl"
    stack.enqueue(source, "--limit", "2", "--max-tokens", "100")
    result = stack.procs.run(["enqueue", str(source), "--max-tokens", "200"], stack.env)
    assert result.returncode == 1
    assert "max_tokens: 100 != 200" in result.stderr
    assert "Traceback" not in result.stderr


def test_duplicates_and_invalid_rows_are_counted_and_reported(stack: Stack, tmp_path):
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(
        b'{"prompt": "a"}\n{"prompt": "a"}\n{broken\n{"prompt": "   "}\n'
        b'{"prompt": 3}\n\xff\xfe\n{"prompt": "b"}\n'
    )
    result = stack.enqueue(source)
    assert "enqueued 2, already present 0, duplicates 1, invalid 4" in result.stdout
    for line, reason in [(3, "broken JSON"), (4, "empty"), (5, "not a string"), (6, "not UTF-8")]:
        assert f"line {line}: skipped, " in result.stderr and reason in result.stderr
    # One summary says why: the rows read, and each kind of skip with its count.
    assert "read 7 rows" in result.stdout and "duplicates: the same prompt" in result.stdout
    assert "invalid: 1 broken JSON" in result.stdout and "1 not UTF-8" in result.stdout


def test_failed_samples_can_be_retried(stack: Stack, tmp_path):
    source = tmp_path / "p.jsonl"
    source.write_text(json.dumps({"prompt": "a long question " * 40}) + "\n")
    stack.simulator("--max-model-len", "100")  # a server whose context is too short: HTTP 400
    first = stack.worker(concurrency=1)
    stack.enqueue_unchecked(source)
    wait_for(lambda: stack.store.counts().failed == 1, 60, "the sample to fail")
    assert next(iter(stack.store.failures().values())).kind == "400"
    first.terminate()
    first.wait()
    stack.simulator()
    stack.worker(concurrency=1)
    stack.collector()
    result = stack.procs.run(["retry-failed"], stack.env)
    assert "requeued 1" in result.stdout
    stack.wait_complete()
    assert len(stack.lines()) == 1


@pytest.mark.parametrize("command", [["status"], ["enqueue", "x.jsonl"]])
def test_commands_say_so_in_one_line_when_redis_is_down(stack: Stack, command):
    env = {**stack.env, "EAGLEGEN_REDIS_URL": "redis://:hunter22@127.0.0.1:1/0"}
    result = stack.procs.run(command, env)
    assert result.returncode != 0
    assert "cannot reach Redis at redis://:***@127.0.0.1:1/0" in result.stderr
    assert "hunter22" not in result.stderr and "Traceback" not in result.stderr
