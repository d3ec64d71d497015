"""The collector's seams with real processes: a paused collector and its successor, two
collectors on one file, two runs and one file, files that are not ours."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

from common.store import RunStore
from tests.harness import wait_for
from tests.stack import Stack


def _prompts(tmp: Path, n: int, tag: str = "q") -> Path:
    path = tmp / f"{tag}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{tag} question {i}"}) + "\n" for i in range(n)))
    return path


def _ids(path: Path) -> list[str]:
    return [json.loads(x)["id"] for x in path.read_text().splitlines()] if path.exists() else []


def _collect(stack: Stack, out: Path, *extra: str, **env: str):
    return stack.procs.run(["collect", "--out", str(out), *extra], {**stack.env, **env}, 60)


def test_a_collector_paused_past_its_lock_loses_nothing_to_its_successor(stack: Stack, tmp_path):
    stack.simulator("--time-per-token", "0.002", "--max-num-seqs", "8")
    stack.env["EAGLEGEN_COLLECTOR_LOCK_TTL"] = "2"
    stack.env["EAGLEGEN_COLLECT_BATCH"] = "4"
    stack.worker(concurrency=8)
    first_out, second_out = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first = stack.procs.start("collector-a", ["collect", "--out", str(first_out)], stack.env)
    stack.enqueue(_prompts(tmp_path, 60))
    wait_for(lambda: stack.store.counts().written >= 4, 60, "the first collector to write")
    first.send_signal(signal.SIGSTOP)
    time.sleep(3)  # the point of the test: paused longer than its 2 s lock
    second = stack.procs.start("collector-b", ["collect", "--out", str(second_out)], stack.env)
    wait_for(lambda: len(_ids(second_out)) > 0, 60, "the successor to write")
    first.send_signal(signal.SIGCONT)
    wait_for(lambda: first.poll() is not None, 30, "the paused collector to notice and stop")
    assert first.returncode == 1
    assert "lost the collector lock" in stack.procs.logs()
    stack.wait_complete()
    a, b = _ids(first_out), _ids(second_out)
    assert max(Counter(a).values()) == 1 and max(Counter(b).values()) == 1
    assert set(a) | set(b) == set(stack.store.r.smembers(stack.store.keys.accepted))
    counts = stack.store.counts()
    assert counts.written == counts.done == 60 and stack.store.collecting() == []
    second.send_signal(signal.SIGTERM)


def test_a_second_collector_on_the_same_file_is_refused_even_while_the_first_is_paused(
    stack: Stack, tmp_path
):
    stack.simulator()
    first = stack.collector()
    wait_for(lambda: stack.store.r.exists(stack.store.keys.collector_lock), 30, "the lock")
    first.send_signal(signal.SIGSTOP)
    try:
        second = _collect(stack, stack.out, "--once", EAGLEGEN_RUN=stack.run_name + "-other")
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 1
    assert "open in another collector" in second.stderr and "Traceback" not in second.stderr


def test_collecting_a_second_run_into_a_first_runs_file_is_refused_before_redis(
    stack: Stack, tmp_path
):
    stack.simulator()
    stack.worker(concurrency=8)
    source = _prompts(tmp_path, 10)  # the same prompts, so the same ids, in both runs
    stack.enqueue(source)
    other = {**stack.env, "EAGLEGEN_RUN": "second-" + stack.run_name}
    assert stack.procs.run(["enqueue", str(source)], other).returncode == 0
    second = RunStore(stack.store.r, stack.settings.key_prefix, other["EAGLEGEN_RUN"])
    wait_for(lambda: second.counts().done == 10, 60, "the second run to be generated")
    wait_for(lambda: stack.store.counts().done == 10, 60, "the first run to be generated")
    assert _collect(stack, stack.out, "--once").returncode == 0
    before = stack.out.read_bytes()
    result = stack.procs.run(["collect", "--out", str(stack.out), "--once"], other)
    assert result.returncode == 1
    assert "holds records of run" in result.stderr and "Traceback" not in result.stderr
    assert stack.out.read_bytes() == before
    assert second.counts().written == 0 and second.ready_count() == 10  # nothing taken


def test_a_file_that_is_not_ours_or_a_folder_is_a_one_line_error(stack: Stack, tmp_path):
    foreign = tmp_path / "notes.txt"
    foreign.write_bytes(b"my notes\nlast line without newline")
    for out, message in ((foreign, "not an EagleGen output file"), (tmp_path, "is a folder")):
        result = _collect(stack, out, "--once")
        assert result.returncode == 1, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert foreign.read_bytes() == b"my notes\nlast line without newline"
