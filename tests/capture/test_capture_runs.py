"""A capture run in the commands users know: ``failed``, ``retry-failed``, ``status``; its
queue's own reconciler; bad rows refused at enqueue or failed alone; a run pinned to its model."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from broker.layout import queue_lists
from capture.app import create_capture_app
from capture.enqueue import enqueue_rows
from capture.model_config import ModelShape
from common.settings import Settings
from tests.capture.conftest import ROWS, CaptureStack, check_manifest, manifest
from tests.capture.helpers import HIDDEN, LAYERS, VOCAB, build_model, make_rows, write_tokenized
from tests.harness import wait_for

pytestmark = pytest.mark.integration
NAN = 7  # the poisoned token of the NaN model


def _queued(stack: CaptureStack, queue: str) -> int:
    r = stack.store("any").r
    return sum(int(r.llen(key)) for key in queue_lists(queue))


def test_retry_failed_puts_a_capture_runs_rows_back_on_its_capture_queue(
    capture_stack: CaptureStack, tmp_path: Path
):
    capture_stack.model_dir = build_model(tmp_path / "nan-model", nan_token=NAN)
    rows = [[r for r in row if r != NAN] for row in make_rows(10, seed=6)]
    rows[2][1] = rows[5][3] = NAN  # two rows whose states are NaN: failed, kind nonfinite
    tokenized = write_tokenized(tmp_path / "tok", rows, capture_stack.model_dir)
    assert capture_stack.enqueue(tokenized, "rf", tmp_path / "out", "speculators").returncode == 0
    worker = capture_stack.worker(concurrency=2)
    capture_stack.wait_complete("rf")
    capture_stack.procs.stop(worker)
    env = capture_stack.env
    listed = json.loads(capture_stack.procs.run(["failed", "--run", "rf", "--json"], env).stdout)
    assert sorted(row["id"] for row in listed) == ["2", "5"]
    assert {row["kind"] for row in listed} == {"nonfinite"}
    refused = capture_stack.procs.run(["retry-failed", "--run", "rf", "--temperature", "0.5"], env)
    assert refused.returncode != 0 and "capture run" in refused.stderr
    retried = capture_stack.procs.run(["retry-failed", "--run", "rf"], env)
    assert retried.returncode == 0 and "requeued 2" in retried.stdout, retried.stderr
    assert _queued(capture_stack, env["EAGLEGEN_CAPTURE_QUEUE"]) == 2
    assert _queued(capture_stack, env["EAGLEGEN_QUEUE"]) == 0  # nothing on generation's
    counts = capture_stack.store("rf").runs.counts()
    assert (counts.failed, counts.queued) == (0, 2)


def test_two_capture_queues_each_recover_their_lost_rows(
    capture_stack: CaptureStack, tokenized: Path, tmp_path: Path
):
    env = capture_stack.env
    queues = {
        "qa": f"{env['EAGLEGEN_CAPTURE_QUEUE']}-a",
        "qb": f"{env['EAGLEGEN_CAPTURE_QUEUE']}-b",
    }
    r = capture_stack.store("any").r
    for run, queue in queues.items():
        env["EAGLEGEN_CAPTURE_QUEUE"] = queue
        assert capture_stack.enqueue(tokenized, run, tmp_path / run, "speculators").returncode == 0
        r.delete(*queue_lists(queue))  # as if Redis had lost every message
    for queue in queues.values():
        capture_stack.worker(2, EAGLEGEN_CAPTURE_QUEUE=queue)
    wait_for(lambda: _ready_workers(capture_stack) == 2, 240, capture_stack.procs.logs)
    # Each pool's reconciler runs its own passes: its lost rows are found (two passes agree)
    # within lease + two passes of its workers being up; with one lock for every capture
    # queue, a pass served only the queue of the process that won it.
    began = time.monotonic()
    bound = float(env["EAGLEGEN_LEASE_TTL"]) + 2 * float(env["EAGLEGEN_RECONCILE_INTERVAL"])
    for run in queues:
        store = capture_stack.store(run)
        wait_for(lambda s=store: s.runs.counts().done == ROWS, bound, capture_stack.procs.logs)
    assert time.monotonic() - began < bound


def _ready_workers(stack: CaptureStack) -> int:
    logs = stack.procs.logs_dir.glob("capture-worker-*.log")
    return sum(" ready." in p.read_text(errors="replace") for p in logs)


def _status(stack: CaptureStack, run: str) -> dict[str, Any]:
    done = stack.procs.run(["status", "--run", run, "--json"], stack.env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_stopped_capture_worker_hands_its_rows_back_at_once_and_status_says_so(
    capture_stack: CaptureStack, model_dir: Path, tmp_path: Path
):
    rows = make_rows(40, seed=7, low=1500, high=2500)  # forward passes long enough to catch
    tokenized = write_tokenized(tmp_path / "tok", rows, model_dir)
    assert capture_stack.enqueue(tokenized, "hb", tmp_path / "out", "speculators").returncode == 0
    assert "no capture worker serves queue" in " ".join(_status(capture_stack, "hb")["notes"])
    worker = capture_stack.worker(concurrency=4)
    store = capture_stack.store("hb")
    wait_for(lambda: store.r.hlen(store.keys.lease_owner) > 0, 240, capture_stack.procs.logs)
    shown = _status(capture_stack, "hb")
    assert [f":{worker.pid}" in w["name"] for w in shown["workers"]] == [True], shown
    assert shown["notes"] == []
    held = set(store.r.hgetall(store.keys.lease_owner))
    worker.send_signal(signal.SIGTERM)
    # At once: well within the lease (20 s), not when the leases expire.
    wait_for(lambda: store.r.hlen(store.keys.lease_owner) == 0, 8, capture_stack.procs.logs)
    assert worker.wait(timeout=60) == 0
    assert store.runs.still_pending(held) == held  # none written by the stopping worker
    assert _queued(capture_stack, capture_stack.env["EAGLEGEN_CAPTURE_QUEUE"]) >= len(held)
    after = _status(capture_stack, "hb")
    assert after["workers"] == [] and "no capture worker serves queue" in after["notes"][0]


def test_enqueue_refuses_an_id_outside_the_vocabulary_or_a_row_too_long(
    capture_stack: CaptureStack, model_dir: Path, tmp_path: Path
):
    rows = make_rows(12, seed=8)
    rows[4][2] = VOCAB + 88  # tokenized with another, larger tokenizer
    rows[9][0] = VOCAB + 1
    tokenized = write_tokenized(tmp_path / "tok", rows, model_dir)
    refused = capture_stack.enqueue(tokenized, "ov", tmp_path / "out", "speculators")
    assert refused.returncode == 1
    assert f"row 4 holds token id {VOCAB + 88}" in refused.stderr
    assert "another tokenizer" in refused.stderr
    assert capture_stack.store("ov").spec() is None  # nothing recorded, nothing queued
    long = write_tokenized(tmp_path / "long", [*make_rows(3), [1] * 4097], model_dir)
    too_long = capture_stack.enqueue(long, "ov", tmp_path / "out", "speculators")
    assert too_long.returncode == 1 and "row 3 has 4097 tokens" in too_long.stderr


def test_a_row_failing_only_in_the_forward_pass_fails_alone_and_its_batch_is_written(
    capture_stack: CaptureStack, model_dir: Path, tmp_path: Path
):
    rows = make_rows(16, seed=9, low=20, high=20)  # one length: the rows share batches
    rows[3][1] = VOCAB + 5  # a config without vocab_size: enqueue cannot see it
    tokenized = write_tokenized(tmp_path / "tok", rows, model_dir)
    out = tmp_path / "out"
    store = capture_stack.store("br")
    shape = ModelShape(LAYERS, HIDDEN, "float32")  # no vocab_size, no max_position_embeddings
    app = create_capture_app(Settings(redis_url=capture_stack.redis_url, **_queues(capture_stack)))
    enqueue_rows(store, app.publish, tokenized, out, "speculators", None, shape, app.settings.queue)
    capture_stack.env["EAGLEGEN_MAX_RETRIES"] = "0"  # any failure of a good row would be final
    capture_stack.worker(8, EAGLEGEN_CAPTURE_LINGER="0.5")  # the rows share forward passes
    capture_stack.wait_complete("br")
    failures = store.runs.failures()
    assert list(failures) == ["3"] and failures["3"].kind == "bad_row", failures
    wait_for(lambda: len(manifest(out)) >= 15, 30, "the manifest's lines")
    assert sorted(line["row"] for line in manifest(out)) == [i for i in range(16) if i != 3]


def _queues(stack: CaptureStack) -> dict[str, str]:
    return {
        "queue": stack.env["EAGLEGEN_QUEUE"],
        "capture_queue": stack.env["EAGLEGEN_CAPTURE_QUEUE"],
    }


def test_a_worker_with_another_model_of_the_same_shape_writes_nothing(
    capture_stack: CaptureStack, tokenized: Path, model_dir: Path, tmp_path: Path
):
    out = tmp_path / "out"
    assert capture_stack.enqueue(tokenized, "pin", out, "speculators").returncode == 0
    capture_stack.model_dir = build_model(tmp_path / "other", seed=1)  # same depth and width
    capture_stack.worker(concurrency=4)
    store = capture_stack.store("pin")
    wait_for(lambda: store.refused_workers(), 240, capture_stack.procs.logs)
    # Past the reconciler's passes that publish the dropped rows again, and their refusal.
    wait_for(lambda: "reconciled run pin" in capture_stack.procs.logs(), 60, "a reconciler pass")
    queue = capture_stack.env["EAGLEGEN_CAPTURE_QUEUE"]
    wait_for(lambda: _queued(capture_stack, queue) == 0, 60, "the new messages taken")
    counts = store.runs.counts()
    assert (counts.done, counts.failed, counts.pending) == (0, 0, ROWS), counts
    assert not (out / "hidden_states").exists() or not any((out / "hidden_states").iterdir())
    shown = _status(capture_stack, "pin")
    assert "refuses the run's rows" in shown["notes"][0] and "other" in shown["notes"][0]
    assert "with the run's model" in shown["notes"][-1]
    capture_stack.model_dir = model_dir  # the run's own model takes the rows
    capture_stack.worker(concurrency=4)
    capture_stack.wait_complete("pin")
    assert len(check_manifest_eventually(out)) == ROWS


def check_manifest_eventually(out: Path) -> list[dict[str, Any]]:
    wait_for(lambda: len(manifest(out)) >= ROWS, 30, "the manifest's lines")
    return check_manifest(out, ROWS)
