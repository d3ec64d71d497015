"""Background loops outlive any exception of one turn: counted in Redis, shown by status."""

from __future__ import annotations

import threading

from cli import status_view
from common.loop_errors import LoopErrors, read_loop_errors, restarted
from common.models import GenParams
from common.settings import Settings
from common.store import RunStore
from tests.harness import wait_for
from worker.pipeline.ticker import Ticker


def test_a_tick_that_raises_is_counted_and_the_next_one_runs(rdb):
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) < 3:
            raise ValueError(f"garbled value {len(ticks)}")

    settings = Settings()
    ticker = Ticker("test-loop", 0.01, tick, LoopErrors.of(rdb, settings))
    ticker.start()
    try:
        wait_for(lambda: len(ticks) >= 4, 10, "the ticker to go on after two failing ticks")
    finally:
        ticker.close()
    shown = read_loop_errors(rdb, settings.key_prefix)
    assert shown == {"test-loop": {"count": 2, "last": "ValueError: garbled value 2"}}


def test_a_loop_that_raises_is_started_again_until_it_is_stopped(rdb):
    stop, turns = threading.Event(), []

    def body() -> None:
        turns.append(1)
        if len(turns) < 3:
            raise KeyError("on")
        stop.wait()  # the loop proper, until stopped

    errors = LoopErrors(rdb, "eaglegen")
    thread = threading.Thread(target=restarted("slot-renewer", body, errors, stop, 0.01))
    thread.start()
    wait_for(lambda: len(turns) == 3, 10, "the loop's third start")
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and errors.counts == {"slot-renewer": 2}
    assert read_loop_errors(rdb, "eaglegen")["slot-renewer"]["count"] == 2


def test_status_shows_the_exceptions_loops_survived(rdb):
    settings = Settings(run="shown")
    store = RunStore(rdb, settings.key_prefix, "shown")
    store.ensure_params(GenParams())
    LoopErrors.of(rdb, settings).survived("reconciler", ValueError("garbled entry"))
    data = status_view.gather(store, settings)
    assert data["loop_errors"] == {"reconciler": {"count": 1, "last": "ValueError: garbled entry"}}
    text = " ".join(str(part) for part in status_view.render(data, clip=False).renderables)
    assert "background loop reconciler survived 1 exceptions" in text
