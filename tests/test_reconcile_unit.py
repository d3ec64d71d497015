from broker.scan import MessageRef
from worker.pipeline.reconcile import lost_samples


def _ref(sample, queued=False, since=0.0):
    return MessageRef("run", sample, queued, since)


def test_a_pending_sample_with_no_lease_and_no_message_is_lost():
    assert lost_samples({"a", "b"}, {"a"}, [], now=100.0, grace=10.0) == {"b"}


def test_a_queued_message_keeps_its_sample_alive():
    assert lost_samples({"a"}, set(), [_ref("a", queued=True)], now=100.0, grace=10.0) == set()


def test_a_recently_delivered_message_is_given_time_to_take_its_lease():
    assert lost_samples({"a"}, set(), [_ref("a", since=95.0)], now=100.0, grace=10.0) == set()


def test_a_delivered_message_with_no_lease_after_the_grace_belongs_to_a_dead_worker():
    assert lost_samples({"a"}, set(), [_ref("a", since=80.0)], now=100.0, grace=10.0) == {"a"}


def test_a_retry_waiting_for_its_eta_is_alive():
    assert lost_samples({"a"}, set(), [_ref("a", since=150.0)], now=100.0, grace=10.0) == set()
