"""Celery task events: off unless a setting or Flower turns them on. A real worker, a real
event receiver on the broker (what Flower listens with)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.settings import Settings
from tests.harness import wait_for
from tests.stack import Stack
from worker.app import EagleGenCelery, create_app


class EventLog:
    """Every event type the workers publish, received in a thread as Flower receives them."""

    def __init__(self, app: EagleGenCelery) -> None:
        self.types: list[str] = []
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self._seen})
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _seen(self, event: dict) -> None:
        self.types.append(event["type"])

    def _receive(self) -> None:
        self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def task_events(self) -> list[str]:
        return [t for t in self.types if t.startswith("task-")]

    def close(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(10)
        self._connection.release()


@pytest.fixture
def app(stack: Stack) -> EagleGenCelery:
    return create_app(Settings(redis_url=stack.env["EAGLEGEN_REDIS_URL"],
                               queue=stack.env["EAGLEGEN_QUEUE"]))  # fmt: skip


@pytest.fixture
def events(app: EagleGenCelery) -> Iterator[EventLog]:
    log = EventLog(app)
    yield log
    log.close()


def _run(stack: Stack, tmp: Path, events: EventLog, n: int) -> None:
    # A heartbeat proves the receiver listens (workers send them whatever the setting).
    wait_for(lambda: "worker-heartbeat" in events.types, 30, "a worker heartbeat")
    source = tmp / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    stack.enqueue(source)
    stack.wait_complete()


def test_a_worker_sends_no_task_events_by_default(stack: Stack, tmp_path, events):
    stack.simulator()
    stack.worker(concurrency=2)
    stack.collector()
    _run(stack, tmp_path, events, 3)
    heartbeats = events.types.count("worker-heartbeat")
    wait_for(lambda: events.types.count("worker-heartbeat") > heartbeats, 30, "one more beat")
    assert events.task_events() == []


def test_the_setting_turns_task_events_on_from_the_start(stack: Stack, tmp_path, events):
    stack.simulator()
    stack.worker(concurrency=2, EAGLEGEN_TASK_EVENTS="true")
    stack.collector()
    _run(stack, tmp_path, events, 3)
    wait_for(lambda: events.task_events().count("task-succeeded") == 3, 30, "3 tasks succeeded")
    assert events.task_events().count("task-received") == 3


def test_flower_turns_them_on_in_a_running_worker(stack: Stack, tmp_path, events, app):
    stack.simulator()
    stack.worker(concurrency=2)
    stack.collector()
    wait_for(lambda: "worker-heartbeat" in events.types, 30, "a worker heartbeat")
    # What Flower broadcasts every 5 s (its --enable-events, on by default).
    wait_for(lambda: bool(app.control.enable_events(reply=True, timeout=2)), 30, "a reply")
    _run(stack, tmp_path, events, 3)
    wait_for(lambda: events.task_events().count("task-succeeded") == 3, 30, "3 tasks succeeded")
