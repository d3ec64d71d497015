import random

from common.backoff import backoff_delay
from common.ids import ID_HEX_CHARS, sample_id


def test_the_same_prompt_always_gets_the_same_id():
    assert sample_id("s", ["a", "b"]) == sample_id("s", ["a", "b"])
    assert len(sample_id(None, ["a"])) == ID_HEX_CHARS


def test_ids_change_with_turns_order_and_system_prompt():
    ids = {sample_id(None, ["a", "b"]), sample_id(None, ["b", "a"]), sample_id("s", ["a", "b"])}
    assert len(ids) == 3


def test_no_system_prompt_and_an_empty_one_are_the_same_prompt():
    assert sample_id(None, ["a"]) == sample_id("", ["a"])


def test_backoff_grows_exponentially_up_to_the_cap_with_full_jitter():
    rng = random.Random(1)
    first = [backoff_delay(0, 2.0, 300.0, rng) for _ in range(500)]
    late = [backoff_delay(20, 2.0, 300.0, rng) for _ in range(500)]
    assert max(first) <= 2.0 and min(first) >= 0.0
    assert max(late) <= 300.0 and max(late) > 250.0  # capped, and the whole range is used
    assert min(late) < 50.0  # full jitter: early retries are possible even late


def test_backoff_survives_absurd_retry_counts():
    assert 0.0 <= backoff_delay(10_000, 1.0, 5.0) <= 5.0
