"""`make chaos`'s accounting (scripts/chaos.py), on hand-made simulator logs: how a paused
worker's requests ended, and which generations finished twice count against aborts."""

import functools
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _chaos():
    spec = importlib.util.spec_from_file_location("chaos_script", ROOT / "scripts/chaos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_script"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _end(key, rid, ts, event="completed", tokens=10, by_request=False):
    return {"key": key, "request_id": rid, "ts": ts, "event": event,
            "completion_tokens": tokens, "abort_requested": by_request}  # fmt: skip


def _record(tokens, discarded=None):
    turn = {"usage": {"completion_tokens": tokens}, "discarded_tokens": discarded}
    return {"generation": {"turns": [turn]}}


def test_a_paused_workers_requests_are_told_apart_by_how_and_when_they_ended():
    chaos = _chaos()
    due = chaos.ABORT_DUE_S
    events = [
        _end("a", "r-a", 101.0),  # ended into the frozen socket: no abort could reach it
        _end("b", "r-b", 100 + due - 1, "aborted", tokens=60, by_request=True),
        _end("c", "r-c", 100 + due + 5),  # ran on past the reaper: what the run fails on
        _end("d", "r-d", 100 + due + 5, "aborted", tokens=20, by_request=True),  # too late
        _end("e", "r-e", 103.0, "aborted", tokens=30),  # cut otherwise (its socket closed)
    ]
    pause = chaos.PausedWorker(100.0, ["r-a", "r-b", "r-c", "r-d", "r-e", "r-gone"], {"a"})
    found = chaos.paused_streams(events, [pause], tpt=0.5)
    assert found.tally == {
        "requests": 5, "finished_before_abort_due": 1, "aborted": 1, "ran_past_abort_due": 1,
        "aborted_late": 1, "cut_otherwise": 1, "abort_after_pause_s_max": round(due + 5, 2),
    }  # fmt: skip
    assert found.unabortable == {"a"}
    # Tokens after the pause, at 0.5 s a token: b (due - 1 s), d (all 20), e (3 s).
    assert found.after_pause == round((due - 1) / 0.5) + 20 + 6


def test_generations_finished_twice_are_split_by_cause():
    chaos = _chaos()
    events = [
        _end("paused", "1", 101.0), _end("paused", "2", 110.0),  # a paused worker's, unabortable
        _end("redis", "3", 202.0), _end("redis", "4", 215.0),  # finished while Redis was frozen
        _end("other", "5", 300.0), _end("other", "6", 310.0),  # neither: counts against aborts
        _end("cut", "7", 50.0, "stalled", tokens=4), _end("cut", "8", 60.0),
    ]  # fmt: skip
    records = {i: _record(10) for i in ("paused", "redis", "other")}
    records["cut"] = _record(10)
    paused = chaos.Paused({}, {"paused"}, after_pause=0)
    waste = chaos.gpu_waste(events, records, paused, [(200.0, 8.0)])
    assert waste["tokens_generated"] == 74 and waste["tokens_in_output"] == 40
    assert waste["gpu_waste_pct_finished_twice_in_worker_pauses"] == 25.0
    assert waste["gpu_waste_pct_finished_twice_in_redis_pause"] == 25.0
    assert waste["gpu_waste_pct_finished_twice_otherwise"] == 25.0
    assert waste["gpu_waste_pct_breaks"] == 10.0  # the stalled stream's 4 tokens
