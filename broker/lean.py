"""Task messages without Celery's empty fields: every queued sample waits in Redis as one.

Celery's protocol 2 writes every header whether set or not (``"shadow": null``, ``"timelimit":
[null, null]``, ``"stamps": {}``...), a reply address for a result backend EagleGen does not
use, the task id three times, and a body whose fourth part is four nulls; with them, most of
what a queued sample costs Redis is its message. The worker reads every one of those fields
with a default (``celery/worker/request.py``: ``.get``, or ``'shadow' in``), so
leaving out the empty ones changes nothing it sees; ``lang``, ``task``, ``id``, ``retries``,
``argsrepr``, ``kwargsrepr`` and ``origin`` stay, and a retry's ``eta`` is kept (it is set).

The argument reprs are made here from the two short strings (Celery's saferepr walks them
character by character); passing them to ``send_task`` instead would copy them into the
properties.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP, task_message

# Reply routing for a result backend: none is configured (results go to Redis by EagleGen).
_UNUSED_PROPERTIES = ("reply_to", "correlation_id")


class LeanAMQP(AMQP):  # type: ignore[misc]
    """Celery's message builder, leaving out the fields a message of ours never sets."""

    def as_task_v2(
        self, task_id: str, name: str, args: Any = None, kwargs: Any = None, *rest: Any, **kw: Any
    ) -> Any:
        if kw.get("argsrepr") is None:
            kw["argsrepr"] = repr(list(args or ()))
        if kw.get("kwargsrepr") is None:
            kw["kwargsrepr"] = repr(dict(kwargs or {}))
        message = super().as_task_v2(task_id, name, args, kwargs, *rest, **kw)
        headers = {k: v for k, v in message.headers.items() if not _empty(k, v, task_id)}
        properties = {k: v for k, v in message.properties.items() if k not in _UNUSED_PROPERTIES}
        args_, kwargs, embed = message.body
        body = (args_, kwargs, {k: v for k, v in embed.items() if v is not None})
        return task_message(headers, properties, body, message.sent_event)


def _empty(key: str, value: Any, task_id: str) -> bool:
    if key == "root_id":
        return bool(value == task_id)  # a task of its own: the worker takes a missing root as that
    if key in ("retries", "argsrepr", "kwargsrepr"):
        return False
    return value is None or value == [None, None] or value == {} or value == 0
