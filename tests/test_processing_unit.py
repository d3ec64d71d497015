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
    proc, _, _, _ = _processor(
        store, errors.BadRequest("HTTP 400: key sk-secret-123 rejected"), settings=settings
    )
    with pytest.raises(errors.BadRequest):
        proc.process("r", "a")
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


def _lose_lease_after_take(store: FakeStore) -> None:
    """Every lease taken expires at once and another worker takes the sample over."""
    real_take = store.take

    def take_then_lose(sample_id, owner, ttl_s, retries=0, ceiling=0):
        taken = real_take(sample_id, owner, ttl_s, retries, ceiling)
        store.leases[sample_id] = "the-new-holder"  # ours expired mid-generation
        return taken

    store.take = take_then_lose


def test_a_result_whose_lease_another_worker_took_is_refused_and_counted_wasted():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, observer, _ = _processor(store, turn())
    _lose_lease_after_take(store)
    assert proc.process("r", "a") == "lease_lost"
    assert "a" in store.pending and observer.events[-1] == ("finished", (7, False))


def test_a_failure_is_not_stored_once_another_worker_holds_the_lease():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, _, _ = _processor(store, errors.BadRequest("400"))
    _lose_lease_after_take(store)
    with pytest.raises(errors.BadRequest):
        proc.process("r", "a")
    assert store.failed == {} and "a" in store.pending


def test_a_transient_error_with_retries_left_gives_the_lease_back_and_fails_nothing():
    store = FakeStore()
    store.add(sample("a"))
    proc, _, _, _ = _processor(store, errors.ServerError("500"))
    with pytest.raises(errors.ServerError):
        proc.process("r", "a", retries=0)
    assert store.failed == {} and "a" not in store.leases and "a" in store.pending


def test_an_exception_outside_the_tree_on_the_last_attempt_is_stored_as_failed():
    """Before, only a GenerationError was stored: the sample stayed pending without a lease,
    the reconciler re-published it with its retries at 0, and it ran for ever."""
    store = FakeStore()
    store.add(sample("a"))
    settings = Settings(api_key="sk-secret-123", max_retries=1)
    proc, _, observer, _ = _processor(
        store, TypeError("first"), TypeError("id 7 is no str (sk-secret-123)"), settings=settings
    )
    with pytest.raises(errors.Unexpected):
        proc.process("r", "a", retries=0)
    assert store.failed == {} and "a" not in store.leases  # a retry is left: given back
    with pytest.raises(errors.Unexpected) as raised:
        proc.process("r", "a", retries=1)
    assert isinstance(raised.value.__cause__, TypeError)
    failure = store.failed["a"]
    assert (failure.kind, failure.attempts) == ("unexpected", 2)
    assert failure.message.startswith("TypeError: id 7") and "sk-secret-123" not in failure.message
    assert observer.events == [("error", "Unexpected"), ("error", "Unexpected")]
