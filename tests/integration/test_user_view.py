"""What a user sees (issue 29): parameters checked before a run, a status that says who works
on it and how its samples end, failed samples a command away. Real workers, a real collector,
the simulator with a ``max_model_len``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.harness import ROOT, wait_for
from tests.stack import Stack

MT_BENCH = ROOT / "data" / "mt_bench_question.jsonl"


def _status(stack: Stack) -> dict[str, Any]:
    result = stack.procs.run(["status", "--json"], stack.env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _prompts(tmp: Path, n: int, words: int = 3) -> Path:
    source = tmp / "p.jsonl"
    rows = [{"prompt": f"question {i} " + "word " * words} for i in range(n)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return source


def test_status_says_when_no_worker_serves_the_run_and_no_collector_writes_it(
    stack: Stack, tmp_path
):
    stack.simulator()
    stack.enqueue(_prompts(tmp_path, 4))

    idle = _status(stack)
    assert idle["workers"] == [] and idle["eta_s"] is None
    assert any("no worker is serving this run's queue" in n for n in idle["notes"])
    text = stack.procs.run(["status"], stack.env).stdout
    assert "ETA unknown" in text and "no worker is serving" in text

    worker = stack.worker(concurrency=2)
    wait_for(lambda: _status(stack)["done"] == 4, 60, "the answers")
    answered = _status(stack)
    assert [w["name"] for w in answered["workers"]] and answered["written"] == 0
    assert any("no collector is writing this run" in n for n in answered["notes"])
    assert not any("no worker" in n for n in answered["notes"])

    stack.collector()
    stack.wait_complete()
    done = _status(stack)
    assert done["collector_alive"] and done["notes"] == [] and done["eta_s"] == 0

    stack.procs.stop(worker)  # a worker that stops withdraws its heartbeat at once
    assert _status(stack)["workers"] == []

    killed = stack.worker(concurrency=2)
    wait_for(lambda: _status(stack)["workers"] != [], 30, "the second worker's heartbeat")
    killed.kill()  # no withdrawal: its heartbeat goes stale
    stack.enqueue(_prompts(tmp_path, 6))
    wait_for(lambda: _status(stack)["workers"] == [], 30, "the dead worker to drop out")
    stale = _status(stack)
    assert stale["eta_s"] is None and any("no worker is serving" in n for n in stale["notes"])


def test_cut_turns_and_the_turns_they_dropped_are_counted(stack: Stack):
    stack.simulator("--min-answer-tokens", "40", "--max-answer-tokens", "60")
    stack.worker(concurrency=4)
    stack.collector()
    stack.enqueue(MT_BENCH, "--limit", "6", "--max-tokens", "8")  # two turns each, both cut
    stack.wait_complete()

    status = _status(stack)
    assert (status["done"], status["failed"]) == (6, 0)
    assert (status["cut_turns"], status["dropped_turns"]) == (6, 6)
    assert any("6 turns were cut at max_tokens" in n for n in status["notes"])
    records = stack.lines()
    assert all(r["generation"]["finish_reason"] == "length" for r in records)
    assert all(len(r["conversations"]) == 2 for r in records)
    text = stack.procs.run(["status"], stack.env).stdout
    assert "cut turns" in text and "turns dropped" in text


def test_sampling_left_unset_is_recorded_as_the_servers_and_piped_status_is_whole(
    stack: Stack, tmp_path
):
    url = stack.simulator()
    stack.worker(concurrency=1)
    stack.collector()
    stack.enqueue(_prompts(tmp_path, 1))
    stack.wait_complete()
    [record] = stack.lines()
    params = record["generation"]["params"]
    assert "temperature" not in params and "top_p" not in params  # not sent, not invented

    status = _status(stack)
    assert status["params"]["temperature"] == "server default"
    runs = json.loads(stack.procs.run(["runs", "--json"], stack.env).stdout)
    [row] = [r for r in runs if r["run"] == stack.run_name]
    assert row["params"]["top_p"] == "server default" and row["params"]["max_tokens"] == 2048
    text = stack.procs.run(["status"], {**stack.env, "COLUMNS": "80"}).stdout
    assert f"{url}/v1" in text  # never cut to the width when piped
    assert "sampling: the server's defaults" in text


def test_bad_parameters_are_refused_at_enqueue_in_one_line(stack: Stack, tmp_path):
    stack.simulator("--max-model-len", "2048")
    source = _prompts(tmp_path, 2)
    for options, expected in [
        (["--temperature", "inf"], "temperature must be a finite number, not inf"),
        (["--temperature", "nan"], "temperature must be a finite number, not nan"),
        (["--temperature", "9"], "temperature must be in [0, 2], not 9"),
        (["--top-p", "0"], "top_p must be in (0, 1], not 0"),
        (["--max-tokens", "100000"], "does not fit the servers' max_model_len 2048"),
    ]:
        result = stack.procs.run(["enqueue", str(source), *options], stack.env)
        assert result.returncode == 1, (options, result.stdout)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and expected in lines[0], (options, result.stderr)
    assert not stack.store.exists()  # nothing was created

    long_rows = tmp_path / "long.jsonl"
    long_rows.write_text(
        json.dumps({"prompt": "long " * 2000}) + "\n" + json.dumps({"prompt": "a"}) + "\n"
    )
    result = stack.enqueue(long_rows, "--max-tokens", "1024")
    assert "enqueued 1, already present 0, duplicates 0, invalid 0, too long 1" in result.stdout


def test_rows_each_refused_with_a_400_fail_alone_and_retry_under_new_parameters(
    stack: Stack, tmp_path
):
    stack.simulator("--max-model-len", "400")
    source = _prompts(tmp_path, 30, words=100)  # ~215 prompt tokens at this server
    # enqueue's estimate is a lower bound (a token a word: 104), so these pass its check and
    # every request is then a 400.
    stack.enqueue(source, "--max-tokens", "250")
    stack.worker(concurrency=2)
    wait_for(lambda: stack.store.counts().failed == 30, 90, "every sample to fail")

    failures = stack.store.failures()
    sent = [f for f in failures.values() if f.kind == "400"]
    # A 400 is the row's own (its prompt over the context here): it never opens the breaker.
    assert len(sent) == 30 and {f.attempts for f in sent} == {1}
    assert _status(stack)["circuit_open"] is None

    listed = json.loads(stack.procs.run(["failed", "--json"], stack.env).stdout)
    assert len(listed) == 30 and {"id", "kind", "message", "attempts", "source"} <= set(listed[0])
    assert listed[0]["source"].startswith("p.jsonl line ")
    only = json.loads(stack.procs.run(["failed", "--kind", "400", "--json"], stack.env).stdout)
    assert len(only) == len(sent) and "maximum context length" in only[0]["message"]

    stack.collector()
    result = stack.procs.run(["retry-failed", "--max-tokens", "40"], stack.env)
    assert "requeued 30 failed samples" in result.stdout and "max_tokens 40" in result.stdout
    stack.wait_complete()
    records = stack.lines()
    assert len(records) == 30
    assert {r["generation"]["params"]["max_tokens"] for r in records} == {40}
    assert _status(stack)["circuit_open"] is None


def test_stored_parameters_that_no_longer_validate_fail_each_sample_once(stack: Stack, tmp_path):
    stack.simulator()
    stack.enqueue(_prompts(tmp_path, 3))
    # A run stored by an older version with a value the check now refuses.
    stack.store.r.hset(stack.store.keys.meta, "params", '{"max_tokens": 16, "temperature": 9}')
    stack.worker(concurrency=2)
    wait_for(lambda: stack.store.counts().failed == 3, 60, "the samples to fail")
    failures = stack.store.failures()
    assert {f.kind for f in failures.values()} == {"bad_params"}
    assert all(f.attempts == 1 for f in failures.values())
    assert "temperature must be in [0, 2], not 9" in next(iter(failures.values())).message
    assert _status(stack)["retries"] == 0

    again = stack.procs.run(["enqueue", str(_prompts(tmp_path, 1))], stack.env)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "temperature must be in [0, 2], not 9" in again.stderr


def test_a_hand_back_is_no_error_and_not_against_its_endpoint(stack: Stack, tmp_path):
    stack.simulator("--time-per-token", "0.2", "--min-answer-tokens", "200")
    worker = stack.worker(concurrency=3, EAGLEGEN_SHUTDOWN_GRACE="0.5")
    stack.enqueue(_prompts(tmp_path, 3))
    wait_for(lambda: stack.store.counts().in_flight == 3, 30, "three samples in flight")
    stack.procs.stop(worker)

    status = _status(stack)
    assert status["handoffs"] == {"handed_back": 3}
    assert "handed_back" not in status["errors"]
    for endpoint in status["endpoints"].values():
        assert endpoint.get("errors", 0) == 0 and endpoint.get("error_rate", 0) == 0
    text = stack.procs.run(["status"], stack.env).stdout
    assert "handed_back (not an error)" in text


def test_a_second_collector_says_why_it_waits_and_leaves_no_file(stack: Stack, tmp_path):
    stack.simulator()
    stack.enqueue(_prompts(tmp_path, 1))
    first = stack.collector()
    wait_for(lambda: stack.store.r.exists(stack.store.keys.collector_lock), 30, "the first lock")
    other = tmp_path / "other.jsonl"
    env = {**stack.env, "EAGLEGEN_COLLECTOR_LOCK_TTL": "2"}
    started = time.monotonic()
    proc = stack.procs.start("collector2", ["collect", "--out", str(other)], env)
    log = Path(stack.procs.logs_dir) / f"collector2-{len(stack.procs.procs) - 1}.log"
    wait_for(lambda: "another collector holds the lock" in log.read_text(), 10, "the reason")
    assert time.monotonic() - started < 8  # said at once, not after the wait
    assert proc.wait(30) == 1
    assert "another collector is already writing run" in log.read_text()
    assert not other.exists() and not other.with_name("other.jsonl.ids").exists()
    assert first.poll() is None


def test_settings_typos_are_named_and_the_worker_says_which_model_it_serves(stack: Stack):
    stack.simulator()
    result = stack.procs.run(["runs"], {**stack.env, "EAGLEGEN_ENDPOINT": "http://x:1/v1"})
    assert (
        "ignored, no such setting: EAGLEGEN_ENDPOINT (did you mean EAGLEGEN_ENDPOINTS?)"
        in result.stderr
    )
    stack.worker(concurrency=1)
    wait_for(lambda: "serving model" in stack.procs.logs(), 30, "the worker's model line")
    assert stack.procs.logs().count("serving model") == 1


def test_an_empty_source_file_says_so(stack: Stack, tmp_path):
    for name in ("e.jsonl", "e.json"):
        (tmp_path / name).write_bytes(b"")
        result = stack.procs.run(["enqueue", str(tmp_path / name)], stack.env)
        assert result.returncode == 1 and f"{name}: empty file" in result.stderr
