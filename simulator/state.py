"""Everything one simulator app owns: config, fault plan, admission, stats, metrics and log."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from simulator.admission import Slots
from simulator.bookkeeping import GenerationLog, Metrics, Stats
from simulator.config import SimConfig
from simulator.faults import FaultPlan
from simulator.jobs import ConfigUpdate, Job
from simulator.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from simulator.hidden_states import HiddenStates

EndEvent = Literal["completed", "aborted", "stalled", "disconnected"]


class SimState:
    """Everything one simulator app owns: config, admission, stats, metrics and log."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.plan = FaultPlan.from_config(cfg)
        self.slots = Slots(cfg.max_num_seqs)
        self.stats = Stats()
        self.metrics = Metrics(cfg.model_name, self.slots)
        self.log = GenerationLog(cfg.log_path)
        self.cache = PrefixCache(cfg.prefix_cache_blocks, cfg.block_size)
        self.attempts: Counter[str] = Counter()
        self.created = int(time.time())
        # Set when the server shuts down so stalled generations let go instead of blocking it.
        self.stopping = asyncio.Event()
        self._ids = itertools.count(1)
        # Request id -> the stop of the job generating it, for POST /inference/v1/abort_requests.
        self.running: dict[str, asyncio.Event] = {}
        # Aborted by request: their ends are logged so.
        self.abort_requested: set[str] = set()
        self.hidden: HiddenStates | None = None
        if cfg.hidden_states_model is not None and cfg.hidden_states_dir is not None:
            from simulator.hidden_states import HiddenStates  # torch only when asked for

            self.hidden = HiddenStates(
                cfg.hidden_states_model, cfg.hidden_states_dir, cfg.hidden_states_layers,
                cfg.hidden_states_wrong_ids, cfg.hidden_states_zeros,
            )  # fmt: skip

    def new_request_id(self, key: str, prefix: str = "chatcmpl", given: str | None = None) -> str:
        """The request's id: ``<prefix>-<X-Request-Id>`` where the client chose one (as vLLM
        builds it), else a unique one that also shows the prompt key."""
        if given:
            return f"{prefix}-{given}"
        return f"{prefix}-{key}-{next(self._ids)}"

    def abort(self, request_ids: list[str]) -> int:
        """Stop the named generations; how many were running. As vLLM does, each stream then
        ends with a last chunk ``finish_reason: "abort"``, usage and ``[DONE]``: the
        connection stays open."""
        ids = [i for i in request_ids if i in self.running]
        found = [self.running.pop(i) for i in ids]
        self.abort_requested.update(ids)
        for stop in found:
            stop.set()
        self.stats.aborted_by_request += len(found)
        return len(found)

    def next_attempt(self, key: str) -> int:
        """Count one more attempt of prompt `key` and return its 1-based number."""
        self.attempts[key] += 1
        return self.attempts[key]

    def update(self, change: ConfigUpdate) -> None:
        """Apply a runtime config change (capacity and pacing)."""
        self.cfg = self.cfg.model_copy(update=change.model_dump(exclude_none=True))
        self.slots.resize(self.cfg.max_num_seqs)

    def on_start(self, job: Job) -> int:
        """Record that a generation got a slot; return its prompt tokens not in the cache."""
        self.metrics.prompt_tokens.inc(job.prompt_tokens)
        queried = len(job.prompt_ids)
        hits = self.cache.lookup(job.prompt_ids)
        self.cache.insert(job.prompt_ids)
        self.stats.prefix_cache_queries += queried
        self.stats.prefix_cache_hits += hits
        self.stats.prefill_tokens_computed += queried - hits
        self.metrics.prefix_cache_queries.inc(queried)
        self.metrics.prefix_cache_hits.inc(hits)
        return queried - hits

    def on_tokens(self, n: int) -> None:
        """Record `n` generated tokens."""
        self.stats.tokens_generated += n
        self.metrics.generation_tokens.inc(n)

    def on_end(self, job: Job, event: EndEvent, sent: int) -> None:
        """Record the end of a generation in stats, metrics, the prefix cache and the log."""
        # vLLM caches the blocks of generated tokens too: a next turn can hit them.
        self.cache.insert(job.prompt_ids + job.ids_of(0, sent))
        finish = job.output.finish_reason if event == "completed" else None
        by_request = job.request_id in self.abort_requested
        self.abort_requested.discard(job.request_id)
        if finish is not None:
            self.stats.completed += 1
            self.stats.generations_by_key[job.key] += 1
            self.metrics.success(finish)
        else:
            self.stats.aborted += 1
        self.log.write(
            {
                "ts": time.time(),
                "key": job.key,
                "request_id": job.request_id,
                "event": event,
                "completion_tokens": sent,
                "finish_reason": finish,
                "abort_requested": by_request,
            }
        )

    def stats_body(self) -> dict[str, Any]:
        """Return the JSON body of GET /sim/stats."""
        s = self.stats
        return {
            "requests": s.requests,
            "completed": s.completed,
            "aborted": s.aborted,
            "aborted_by_request": s.aborted_by_request,
            "rejected": s.rejected,
            "faults": dict(s.faults),
            "running": self.slots.running,
            "waiting": self.slots.waiting,
            "peak_running": self.slots.peak,
            "generations_by_key": dict(s.generations_by_key),
            "tokens_generated": s.tokens_generated,
            "prefill_tokens_computed": s.prefill_tokens_computed,
            "prefix_cache_queries": s.prefix_cache_queries,
            "prefix_cache_hits": s.prefix_cache_hits,
            "prefix_cache_blocks": len(self.cache),
            "max_num_seqs": self.slots.capacity,
            "hidden_states": s.hidden_states,
        }
