"""The one writer of each capture run's ``OUT_DIR/manifest.jsonl``.

Every capture worker process runs a ``ManifestWriters``: it looks for capture runs of its
queue whose manifest nobody writes and starts the collector on them, so exactly one process
cluster-wide appends a run's lines (the run's collector lock, fenced commits, one line per row
id, a cut last line repaired on open: ``collector/``). The others stand by and take over
within the lock's TTL when the writer dies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

import redis

from capture.store import CaptureStore
from collector.collect import Collector
from collector.sink import JsonlSink
from common.errors import CollectorFenced, ConfigError
from common.loop_errors import LoopErrors, guarded
from common.settings import Settings
from common.store import RunStore
from worker.pipeline.ticker import Ticker

log = logging.getLogger("eaglegen.capture")
MANIFEST = "manifest.jsonl"


def manifest_path(out_dir: Path) -> Path:
    """Where a run's manifest lives."""
    return out_dir / MANIFEST


class ManifestWriters:
    """Starts a manifest writer for each capture run of our queue that has none."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.settings = settings
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._errors = LoopErrors.of(client, settings)
        self._ticker = Ticker("manifest-writers", 1.0, self._tick, self._errors)

    def start(self) -> None:
        """Look for runs to write every second (once)."""
        self._ticker.start()

    def close(self) -> None:
        """Stop every writer after its current batch."""
        self._ticker.close()
        self._stop.set()
        for thread in self._threads.values():
            thread.join(timeout=10)

    def _tick(self) -> None:
        try:
            for run in RunStore.known_runs(self.r, self.settings.key_prefix):
                alive = self._threads.get(run)
                if alive is not None and alive.is_alive():
                    continue
                store = CaptureStore(self.r, self.settings.key_prefix, run)
                spec = store.spec()
                if spec is None or store.runs.queue() != self.settings.queue:
                    continue
                if self.r.exists(store.keys.collector_lock):
                    continue  # another process writes it
                self._launch(store, Path(spec.out_dir))
        except redis.RedisError as exc:
            log.warning("manifest writers: Redis unreachable (%s)", exc)

    def _launch(self, store: CaptureStore, out_dir: Path) -> None:
        # A writer that raises is counted; the next tick starts another (its thread is gone).
        write = guarded("manifest-writer", lambda: self._write(store, out_dir), self._errors)
        thread = threading.Thread(target=write, name=f"manifest-{store.run}", daemon=True)
        self._threads[store.run] = thread
        thread.start()

    def _write(self, store: CaptureStore, out_dir: Path) -> None:
        s = self.settings
        try:
            sink = JsonlSink(manifest_path(out_dir), store.run)
        except ConfigError as exc:  # open in another process on this host: it writes
            log.debug("manifest of %s: %s", store.run, exc)
            return
        try:
            Collector(store.runs, sink, s.collect_batch, s.collector_lock_ttl).run(self._stop)
        except (ConfigError, CollectorFenced) as exc:
            log.info("manifest of %s: %s", store.run, exc)
        except OSError as exc:  # a full disk: a cut last line is repaired when it reopens
            log.warning("manifest of %s: %s; trying again", store.run, exc)
        finally:
            with contextlib.suppress(OSError):
                sink.close()
