"""``eaglegen demo`` writes no Redis it did not start, and SIGTERM stops it with its children."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

from tests.harness import Procs, wait_for
from tests.services import require_tool


def _children(pid: int) -> set[int]:
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
            if int(fields["PPid"]) == pid:
                found.add(int(status.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_demo_runs_on_a_redis_of_its_own(procs: Procs):
    require_tool("redis-server")
    done = procs.run(["demo"], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    own = re.search(r"a server of the demo's own at redis://127\.0\.0\.1:(\d+)/", done.stderr)
    assert own is not None and own.group(1) != "6379", done.stderr
    assert "160 answered, 0 failed" in done.stdout


def test_sigterm_stops_the_demo_and_everything_it_started(procs: Procs, tmp_path: Path):
    require_tool("redis-server")
    demo = procs.start("demo", ["demo"])
    log = next(tmp_path.glob("demo-*.log"))
    wait_for(lambda: "started simulator" in log.read_text(), 120, "the demo's children")
    children = _children(demo.pid)  # redis-server, simulator, worker, collector
    assert len(children) == 4, log.read_text()
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(60) != 0
    left = [pid for pid in children if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the demo stopped: {left}"
