"""SIGTERM and SIGINT stop a loop whatever the loop was doing when they came.

A child process waits on ``stop_on_signals()`` the way the collector and the exporter do, in
the tightest loop there is (each wait ends at once, so the main thread spends most of its time
inside the wait's own code), and reports each stop down a pipe; the test sends it hundreds of
signals at random moments. With a ``threading.Event`` there, a signal landing while the main
thread held the Event's lock hung the handler for ever (60 of 100 here).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

from tests.harness import CLI_ENV, ROOT, child_env

ROUNDS = 120  # per child; each round opens a pipe of its own (2 descriptors)
CHILDREN = 2
GRACE_S = 5.0

# Each round: a fresh flag (then "r"), polled (a wait of 0 s) until it is set (then "s").
CHILD = """
import os, sys
from cli.shared import stop_on_signals
for _ in range(int(sys.argv[1])):
    stop = stop_on_signals()
    os.write(1, b"r")
    while not stop.wait(0):
        pass
    os.write(1, b"s")
"""


def _stops(child: subprocess.Popen[bytes], rounds: int, rng: random.Random) -> None:
    assert child.stdout is not None
    for n in range(rounds):
        assert _read(child, 30) == b"r", "the child did not start its round"
        time.sleep(rng.uniform(0, 0.004))
        sig = rng.choice((signal.SIGTERM, signal.SIGINT))
        child.send_signal(sig)
        stopped = _read(child, GRACE_S)
        assert stopped == b"s", f"signal {n + 1} ({sig.name}) not handled within {GRACE_S} s"


def _read(child: subprocess.Popen[bytes], timeout: float) -> bytes:
    """One byte of the child's, or none after ``timeout`` s."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    return os.read(child.stdout.fileno(), 1) if ready else b""


def test_a_signal_at_any_moment_stops_a_loop_waiting_on_the_stop_flag():
    rng = random.Random()
    command = [sys.executable, "-c", CHILD, str(ROUNDS)]
    env = child_env(CLI_ENV)
    children = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE)
        for _ in range(CHILDREN)
    ]
    try:
        for child in children:
            _stops(child, ROUNDS, rng)
            assert child.wait(GRACE_S) == 0
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]
