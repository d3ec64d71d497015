"""The Celery task: a thin adapter from a message (run, sample id) to the worker runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from common import errors
from common.backoff import backoff_delay

if TYPE_CHECKING:
    from worker.app import EagleGenCelery

GENERATE_TASK = "eaglegen.generate"


def register_tasks(app: EagleGenCelery) -> None:
    """Attach EagleGen's tasks to ``app``."""

    @app.task(bind=True, name=GENERATE_TASK, max_retries=None)  # type: ignore[untyped-decorator]
    def generate(self: Any, run: str, sample_id: str) -> str:
        runtime = app.runtime()
        settings = app.settings
        try:
            return runtime.process(run, sample_id)
        except errors.HandedBack:
            app.publish_samples(run, [sample_id])
            return "handed-back"
        except redis.RedisError as exc:
            # Redis restarting: try again soon; if even this publish fails, the reconciler
            # finds the sample (pending, no lease, no message) and re-enqueues it.
            raise self.retry(countdown=5.0, exc=exc) from None
        except errors.PermanentError as exc:
            runtime.fail(run, sample_id, exc)
            return "failed"
        except errors.TransientError as exc:
            store = runtime.store(run)
            retries: int = self.request.retries
            if retries >= settings.max_retries:
                runtime.fail(run, sample_id, exc)
                return "failed"
            store.incr("retries")
            delay = backoff_delay(retries, settings.backoff_base, settings.backoff_max)
            raise self.retry(countdown=delay, exc=exc) from None
