import time

from worker.broker_scan import MessageRef
from worker.reconcile import lost_samples


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


def test_a_delivery_stamped_by_a_skewed_worker_clock_is_judged_on_the_reconcilers_clock():
    from worker.reconcile import Reconciler

    reconciler = Reconciler.__new__(Reconciler)  # only its clock bookkeeping, no Redis
    reconciler._first_seen = {}
    behind = MessageRef("run", "a", queued=False, since=time.time() - 1000, tag="t1")
    [seen] = reconciler._on_our_clock([behind])  # a worker whose clock is 1000 s behind
    now = time.time()
    assert lost_samples({"a"}, set(), [seen], now=now, grace=10.0) == set()
    assert lost_samples({"a"}, set(), [seen], now=now + 11, grace=10.0) == {"a"}
    [again] = reconciler._on_our_clock([behind])
    assert again.since == seen.since  # first sight is remembered across passes


def test_a_retrys_eta_keeps_its_own_date():
    from worker.reconcile import Reconciler

    reconciler = Reconciler.__new__(Reconciler)
    reconciler._first_seen = {}
    eta = MessageRef("run", "a", queued=False, since=time.time() + 60, tag="t2", eta=True)
    assert reconciler._on_our_clock([eta]) == [eta]
