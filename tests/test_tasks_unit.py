"""What the task does after each kind of error, without Celery or Redis."""

import pytest
import redis

from common import errors
from common.settings import Settings
from worker.tasks import REDIS_RETRY_S, after_error

SETTINGS = Settings(max_retries=3, backoff_base=2, backoff_max=300)


@pytest.mark.parametrize(
    "exc",
    [errors.ServerError("500"), errors.RateLimited("429"), errors.StallError("stall"),
     errors.Disconnected("cut"), errors.ConnectError("refused")],
)  # fmt: skip
def test_a_transient_error_is_retried_with_backoff_and_counted(exc):
    step = after_error(exc, retries=1, settings=SETTINGS)
    assert step.action == "retry" and step.counts_as_retry
    assert 0 <= step.countdown <= 2 * 2**1  # full jitter under base * 2^retries


def test_a_transient_error_on_the_last_allowed_retry_fails_the_sample():
    assert after_error(errors.ServerError("500"), retries=3, settings=SETTINGS).action == "fail"


@pytest.mark.parametrize(
    "exc", [errors.BadRequest("400"), errors.AuthError("401"), errors.NotFound("404")]
)
def test_a_permanent_error_fails_at_once(exc):
    assert after_error(exc, retries=0, settings=SETTINGS).action == "fail"


def test_a_redis_error_retries_soon_without_spending_the_retry_budget():
    step = after_error(redis.ConnectionError("down"), retries=3, settings=SETTINGS)
    assert (step.action, step.countdown, step.counts_as_retry) == ("retry", REDIS_RETRY_S, False)


def test_a_stopping_worker_hands_the_sample_back():
    assert after_error(errors.HandedBack("bye"), retries=0, settings=SETTINGS).action == "hand_back"


def test_a_bug_is_not_ours_to_map_and_propagates():
    assert after_error(KeyError("x"), retries=0, settings=SETTINGS) is None


def test_a_lost_lease_ends_the_task_quietly_even_on_the_last_retry():
    for retries in (0, 3):
        step = after_error(errors.LeaseLost("taken"), retries=retries, settings=SETTINGS)
        assert (step.action, step.counts_as_retry) == ("drop", False)
