"""The Celery task: a thin adapter from a message (run, sample id) to the sample processor.

What happens after an error is decided by ``after_error``, a pure function of the exception
tree and the retry count, so it is tested without Celery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis
from celery import Celery, signals

from broker.message import GENERATE_TASK
from common import errors
from common.backoff import backoff_delay
from common.logs import secrets_of
from common.settings import Settings
from worker.pipeline.processing import is_final, unexpected

# Redis restarting: try again soon; if even this publish fails, the reconciler finds the
# sample (pending, no lease, no message) and re-enqueues it.
REDIS_RETRY_S = 5.0


class Processor(Protocol):
    """The work behind a message (``worker.pipeline.processing.SampleProcessor``)."""

    def process(self, run: str, sample_id: str, retries: int = 0) -> str: ...
    def count_retry(self, run: str) -> None: ...


@dataclass(frozen=True)
class Next:
    """After an error: hand the sample back, retry it later, fail it, or drop the message."""

    action: Literal["hand_back", "retry", "fail", "drop"]
    countdown: float = 0.0
    counts_as_retry: bool = False


def after_error(exc: BaseException, retries: int, settings: Settings) -> Next | None:
    """The task's answer to ``exc`` on its ``retries``-th retry; None: not ours, re-raise."""
    if isinstance(exc, errors.HandedBack):
        return Next("hand_back")
    if isinstance(exc, errors.LeaseLost):
        return Next("drop")  # another worker has the sample now: not a failure, not a retry
    if isinstance(exc, redis.RedisError):
        return Next("retry", REDIS_RETRY_S)
    if is_final(exc, retries, settings):
        return Next("fail")
    if isinstance(exc, errors.TransientError):
        delay = backoff_delay(retries, settings.backoff_base, settings.backoff_max)
        return Next("retry", delay, counts_as_retry=True)
    return None


def register_tasks(
    app: Celery, settings: Settings, processor: Callable[[], Processor],
    hand_back: Callable[[str, list[str]], object], name: str = GENERATE_TASK,
) -> None:  # fmt: skip
    """Attach EagleGen's task to ``app`` (``name``: capture's task reuses the adapter)."""

    secrets = secrets_of(settings)

    @app.task(bind=True, name=name, max_retries=None)  # type: ignore[untyped-decorator]
    def generate(self: Any, run: str, sample_id: str) -> str:
        work = processor()
        try:
            return work.process(run, sample_id, self.request.retries)
        except Exception as exc:
            # Translated under the lease already (and stored if final); not what escaped
            # before the lease was taken (it has its attempts ceiling in the take).
            known = unexpected(exc, secrets)
            step = after_error(known, self.request.retries, settings)
            if step is None:
                raise
            return _follow(self, step, known, work, hand_back, run, sample_id)


def _follow(
    task: Any, step: Next, exc: Exception, work: Processor,
    hand_back: Callable[[str, list[str]], object], run: str, sample_id: str,
) -> str:  # fmt: skip
    if step.action == "hand_back":
        hand_back(run, [sample_id])
        return "handed-back"
    if step.action == "drop":
        return "lease-lost"
    if step.action == "fail":
        return "failed"  # stored by the processor, under the sample's lease
    if step.counts_as_retry:
        work.count_retry(run)
    raise task.retry(countdown=step.countdown, exc=exc) from None


def connect_signals(
    app: Celery, on_ready: Callable[[], None], on_stopping: Callable[[], None],
    on_shutdown: Callable[[], None],
) -> None:  # fmt: skip
    """Run the callbacks when the worker running ``app`` is ready, stopping, shut down."""

    # Signals are global in Celery: only react for the worker running this app.
    def ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            on_ready()

    def stopping(sender: Any = None, **_: Any) -> None:
        on_stopping()

    def shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app:
            on_shutdown()

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutting_down.connect(stopping, weak=False)
    signals.worker_shutdown.connect(shutdown, weak=False)
