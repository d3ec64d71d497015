"""The sample processor and the lease keeper, with in-memory fakes at their boundaries."""

import json

import pytest

from common import errors
from common.settings import Settings
from tests.fakes import FakeClient, FakeEndpoints, FakeObserver, FakeStore, sample, turn
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.processing import SampleProcessor


def _processor(store, *script, settings=None):
    settings = settings or Settings()
    leases = LeaseKeeper(lambda run: store, settings.lease_ttl)
    observer = FakeObserver()
    client = FakeClient(*script)
    proc = SampleProcessor(settings, lambda run: store, FakeEndpoints(client), leases, observer)
    return proc, client, observer, leases


def test_a_sample_is_answered_turn_by_turn_and_stored_once():
    store = FakeStore()
    store.add(sample("a", ("q1", "q2")))
    proc, client, observer, leases = _processor(store, turn("one"), turn("two"))
    assert proc.process("r", "a") == "done"
    record = json.loads(store.results["a"])
    assert [m["content"] for m in record["conversations"]] == ["q1", "one", "q2", "two"]
    assert client.calls[1][-2]["content"] == "one"  # turn 2 saw the model's own answer
    assert observer.events[-1] == ("finished", (14, True))
    assert store.leases == {} and leases.count() == 0


def test_a_retry_resumes_at_the_first_unanswered_turn():
    store = FakeStore()
    store.add(sample("a", ("q1", "q2")))
    proc, client, _, _ = _processor(store, turn("one"), errors.ServerError("500"), turn("two"))
    with pytest.raises(errors.ServerError):
        proc.process("r", "a")
    assert [t.content for t in store.partial["a"]] == ["one"]
    assert proc.process("r", "a") == "done"
    assert len(client.calls) == 3  # the first turn was not generated again


def test_each_turn_is_routed_to_the_server_of_the_turn_before_even_after_a_retry():
    store = FakeStore()
    store.add(sample("a", ("q1", "q2", "q3")))
    first, third = turn("one").model_copy(update={"endpoint": "http://x/v1"}), turn("three")
    proc, _, _, _ = _processor(store, first, errors.ServerError("500"), turn("two"), third)
    endpoints = proc.endpoints
    with pytest.raises(errors.ServerError):
        proc.process("r", "a")
    assert proc.process("r", "a") == "done"
    previous = [hint.previous for hint in endpoints.hints]
    # turn 1 (fresh), turn 2 (failed), turn 2 again (resumed from the saved turn 1), turn 3
    assert previous == [None, "http://x/v1", "http://x/v1", "http://e/v1"]
    assert len({hint.key for hint in endpoints.hints}) == 1


def test_a_sample_leased_by_another_worker_or_done_is_skipped_without_a_call():
    store = FakeStore()
    store.add(sample("a"))
    store.leases["a"] = "someone-else"
    proc, client, _, _ = _processor(store, turn())
    assert proc.process("r", "a") == "skipped:leased"
    assert proc.process("r", "missing") == "skipped:done"
    assert client.calls == []


def test_a_lease_lost_to_another_worker_stops_the_generation():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, _, leases = _processor(store, turn())
    store.lost_on_renew = {"a"}
    real_hold = leases.hold

    def hold_then_lose(run, sample_id, token):
        event = real_hold(run, sample_id, token)
        leases.renew_once()  # the renewer finds the lease taken before the first token
        return event

    leases.hold = hold_then_lose
    with pytest.raises(errors.LeaseLost):
        proc.process("r", "a")
    assert "a" in store.pending and not store.results


def test_a_draining_worker_hands_back_once_its_grace_is_over():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, _, _ = _processor(store, turn(), settings=Settings(shutdown_grace=0))
    proc.begin_drain()
    with pytest.raises(errors.HandedBack):
        proc.process("r", "a")


def test_a_failure_is_stored_with_its_class_and_a_redacted_message():
    store = FakeStore()
    store.add(sample("a"))
    settings = Settings(api_key="sk-secret-123")
    proc, _, _, _ = _processor(store, settings=settings)
    proc.fail("r", "a", errors.BadRequest("HTTP 400: key sk-secret-123 rejected"))
    failure = store.failed["a"]
    assert failure.kind == "400" and "sk-secret-123" not in failure.message


def test_errors_and_turns_are_reported_to_the_observer():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, observer, _ = _processor(store, errors.StallError("stall"))
    with pytest.raises(errors.StallError):
        proc.process("r", "a")
    assert observer.events == [("error", "StallError")]


def test_a_run_without_parameters_is_a_permanent_error():
    store = FakeStore(params_=None)
    store.add(sample("a"))
    proc, _, _, _ = _processor(store, turn())
    with pytest.raises(errors.PermanentError):
        proc.process("r", "a")


def test_a_second_message_for_a_sample_this_process_generates_is_acked_without_a_call():
    store = FakeStore()
    store.add(sample("a"))
    proc, client, _, leases = _processor(store, turn())
    assert leases.claim("r", "a")  # another thread of this process is generating it
    assert proc.process("r", "a") == "skipped:here" and client.calls == []
    leases.drop("r", "a")
    assert proc.process("r", "a") == "done"


def test_a_result_whose_lease_another_worker_took_is_refused_and_counted_wasted():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, observer, _ = _processor(store, turn())
    real_take = store.take

    def take_then_lose(sample_id, owner, ttl_s, retries=0):
        taken = real_take(sample_id, owner, ttl_s, retries)
        store.leases[sample_id] = "the-new-holder"  # ours expired mid-generation
        return taken

    store.take = take_then_lose
    assert proc.process("r", "a") == "lease_lost"
    assert "a" in store.pending and observer.events[-1] == ("finished", (7, False))


def test_a_failure_is_not_stored_while_another_worker_holds_the_lease():
    store = FakeStore()
    store.add(sample("a"))
    store.leases["a"] = "someone-else"
    proc, _, _, _ = _processor(store)
    proc.fail("r", "a", errors.ServerError("500"))
    assert store.failed == {} and "a" in store.pending
