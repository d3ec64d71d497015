"""The producer's feeder: rows -> samples -> accepted ids -> published, with backpressure."""

from common.ids import sample_id
from common.models import GenParams
from producer.enqueue import Feeder
from producer.readers import RawRow, SourceInfo
from tests.fakes import FakeStore


def _rows(*datas):
    return [RawRow(index=i, data=d) for i, d in enumerate(datas)]


def _feeder(store, params=None, **kw):
    published: list[list[str]] = []
    feeder = Feeder(
        store=store, params=params or GenParams(), info=SourceInfo(dataset="d.jsonl", split=None),
        publish=published.append, **kw,
    )  # fmt: skip
    return feeder, published


def test_each_distinct_prompt_is_accepted_and_published_once():
    store = FakeStore()
    feeder, published = _feeder(store)
    rows = _rows({"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"})
    counts = feeder.run(rows)
    assert (counts.enqueued, counts.duplicates) == (2, 1)
    assert sorted(i for batch in published for i in batch) == sorted(store.accepted)


def test_a_second_enqueue_of_the_same_rows_adds_nothing():
    store = FakeStore()
    _feeder(store)[0].run(_rows({"prompt": "a"}))
    feeder, published = _feeder(store)
    counts = feeder.run(_rows({"prompt": "a"}))
    assert (counts.enqueued, counts.present, published) == (0, 1, [])


def test_the_id_follows_the_runs_turn_and_system_rule():
    store = FakeStore()
    params = GenParams(turns="first", system="Be brief.")
    feeder, _ = _feeder(store, params)
    feeder.run(_rows({"turns": ["q1", "q2"]}))
    assert store.accepted == {sample_id("Be brief.", ["q1"])}


def test_invalid_rows_are_counted_with_their_row_number_and_never_stop_the_run():
    store = FakeStore()
    seen = []
    feeder, _ = _feeder(store, on_invalid=lambda row, why: seen.append(row))
    counts = feeder.run([RawRow(index=0, data=None, error="broken JSON"), *_rows({"prompt": "x"})])
    assert (counts.invalid, counts.enqueued, seen) == (1, 1, [0])


def test_the_feeder_waits_while_the_run_has_max_pending_samples_waiting():
    store = FakeStore()
    waits = []

    def wait(seconds):
        waits.append(seconds)
        store.pending.clear()  # the workers catch up

    feeder, _ = _feeder(store, max_pending=2, wait=wait)
    counts = feeder.run(_rows(*({"prompt": str(i)} for i in range(5))))
    assert counts.enqueued == 5 and waits
    assert len(store.pending) <= 2
