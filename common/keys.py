"""Every Redis key EagleGen uses, built here and nowhere else.

All keys of a run share the hash tag ``{run}`` so a run's keys live on one Redis Cluster slot
and its Lua scripts stay atomic.
"""

from __future__ import annotations

from dataclasses import dataclass


def runs_key(prefix: str) -> str:
    """The set of known run names."""
    return f"{prefix}:runs"


def retired_runs_key(prefix: str) -> str:
    """The set of retired run names (each keeps only its ``RunKeys.retired`` summary)."""
    return f"{prefix}:retired_runs"


def clocks_key(prefix: str) -> str:
    """Hash worker name -> its last clock-skew reading (JSON), for ``status``."""
    return f"{prefix}:clocks"


def loop_errors_key(prefix: str) -> str:
    """Hash loop name -> exceptions its thread survived (and ``<loop>:last``: the latest, one
    line), for ``status``."""
    return f"{prefix}:loop_errors"


def workers_key(prefix: str) -> str:
    """Hash worker name -> its last heartbeat (JSON: queue, endpoints, in flight, when)."""
    return f"{prefix}:workers"


def reconciler_lock_key(prefix: str, queue: str) -> str:
    """Held by the one worker process running a reconciliation pass over ``queue``'s runs:
    each pass serves one queue, so each queue has its own lock (one pool cannot starve
    another)."""
    return f"{prefix}:reconciler_lock:{queue}"


def capture_reconciler_lock_key(prefix: str) -> str:
    """Held by the one capture worker process running a pass over the capture queue's runs."""
    return f"{prefix}:capture_reconciler_lock"


@dataclass(frozen=True)
class EndpointKeys:
    """Global (not per-run) keys about endpoints: slots, caps, locks, drained set, rates.

    All share the hash tag ``{endpoints}`` so one Lua script can pick an endpoint and take a
    slot in it atomically, on Redis Cluster too.
    """

    prefix: str

    def _key(self, name: str, endpoint: str = "") -> str:
        base = f"{self.prefix}:{{endpoints}}:{name}"
        return f"{base}:{endpoint}" if endpoint else base

    def slots(self, endpoint: str) -> str:
        """Sorted set of the endpoint's slot holders -> lease expiry (ms, Redis clock)."""
        return self._key("slots", endpoint)

    def cap(self, endpoint: str) -> str:
        """The endpoint's cap when an adaptive driver sets it (expires if the driver stops)."""
        return self._key("cap", endpoint)

    def adaptive_lock(self, endpoint: str) -> str:
        """Held by the one process that adjusts the endpoint's cap."""
        return self._key("adaptive_lock", endpoint)

    @property
    def health(self) -> str:
        """Hash endpoint -> JSON of its last known state (up or down, why, when, seen by whom)."""
        return self._key("health")

    @property
    def freed(self) -> str:
        """Pub/sub channel: a slot was given back, a cap grew or an endpoint came back."""
        return self._key("freed")

    @property
    def drained(self) -> str:
        """Set of endpoints that take no new requests."""
        return self._key("drained")

    @property
    def continuation(self) -> str:
        """Hash endpoint -> JSON: whether it continues checkpoints, as a worker learned it."""
        return self._key("continuation")

    @property
    def abort_support(self) -> str:
        """Hash endpoint -> JSON: whether it aborts requests by id, learned once, and why."""
        return self._key("abort_support")

    @property
    def rpm(self) -> str:
        """GCRA state of the cluster-wide requests/min limit."""
        return self._key("rpm")

    @property
    def tpm(self) -> str:
        """GCRA state of the cluster-wide tokens/min limit."""
        return self._key("tpm")


# Fields of ``RunKeys.counters`` beside those the store's scripts keep: turns cut at
# max_tokens, and the later user turns those cuts left unanswered.
CUT_TURNS = "cut_turns"
DROPPED_TURNS = "dropped_turns"
# Turns cut by the context window (prompt + answer reached max_model_len), of CUT_TURNS.
CONTEXT_CUT_TURNS = "context_cut_turns"
# Failed samples retried under new parameters, each from its first turn again.
RESTARTED = "restarted"

# Fields beside a sample's prompt in ``RunKeys.prompts`` (Lua scripts get them as arguments).
ATTEMPTS_SUFFIX = "|attempts"
PARTIAL_SUFFIX = "|partial"
CHECKPOINT_SUFFIX = "|ckpt"


@dataclass(frozen=True)
class RunKeys:
    """Names of one run's keys."""

    prefix: str
    run: str

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.run}}}:{name}"

    @property
    def meta(self) -> str:
        """Hash: generation params, source description, creation time."""
        return self._key("meta")

    @property
    def accepted(self) -> str:
        """Set of every sample id ever accepted into the run (never shrinks)."""
        return self._key("accepted")

    @property
    def pending(self) -> str:
        """Set of ids accepted but neither done nor failed (queued or in flight)."""
        return self._key("pending")

    @property
    def prompts(self) -> str:
        """Hash of each unfinished sample's working state: id -> sample JSON, and beside it
        ``attempts_field(id)``, ``partial_field(id)`` and ``checkpoint_field(id)``. One hash,
        so a worker reads what it needs with one HMGET and a finished sample leaves with one
        HDEL."""
        return self._key("prompts")

    @staticmethod
    def attempts_field(sample_id: str) -> str:
        """In ``prompts``: how many times a worker started on the sample since it was queued."""
        return sample_id + ATTEMPTS_SUFFIX

    @staticmethod
    def partial_field(sample_id: str) -> str:
        """In ``prompts``: turns already answered, so a retry resumes where it stopped."""
        return sample_id + PARTIAL_SUFFIX

    @staticmethod
    def checkpoint_field(sample_id: str) -> str:
        """In ``prompts``: the turn being generated, as far as it got (a ``Checkpoint``), so a
        retry continues it instead of generating it again; written only by the lease holder."""
        return sample_id + CHECKPOINT_SUFFIX

    def checkpoint_log(self, sample_id: str) -> str:
        """String: what the turn in ``checkpoint_field(id)`` generated, appended save by save
        (common/checkpoint_log.py); goes with that field."""
        return self._key(f"ckpt:{sample_id}")

    @property
    def checkpoint_logs(self) -> str:
        """The pattern (SCAN MATCH) of every checkpoint log of the run."""
        return _glob_escape(self._key("ckpt:")) + "*"

    @property
    def results(self) -> str:
        """Hash id -> finished record JSON, until the collector has it on disk."""
        return self._key("results")

    @property
    def ready(self) -> str:
        """List of ids whose results wait for the collector."""
        return self._key("ready")

    @property
    def collecting(self) -> str:
        """List of ids the collector has taken and not yet committed (crash recovery)."""
        return self._key("collecting")

    @property
    def failed(self) -> str:
        """Hash id -> failure JSON (error class and message)."""
        return self._key("failed")

    @property
    def leases(self) -> str:
        """Sorted set id -> lease expiry (ms, Redis clock) of samples being generated."""
        return self._key("leases")

    @property
    def lease_owner(self) -> str:
        """Hash id -> token of the worker holding the lease."""
        return self._key("lease_owner")

    @property
    def reaped(self) -> str:
        """Hash id -> token of the holder whose expired lease the reconciler reaped: only that
        holder may take it back (it was paused, not dead), and only while no one else has."""
        return self._key("reaped")

    @property
    def producers(self) -> str:
        """Sorted set producer id -> heartbeat expiry (ms, Redis clock) of producers feeding
        the run; ``runs retire`` refuses while one is live."""
        return self._key("producers")

    @property
    def refused_endpoints(self) -> str:
        """Hash endpoint -> why it may not serve this run (it serves another model)."""
        return self._key("refused_endpoints")

    @property
    def endpoints_out(self) -> str:
        """Hash endpoint -> why it is out of the run's rotation (it refused the run's requests,
        whatever the sample: a 404, a 401); emptied by ``retry-failed``."""
        return self._key("endpoints_out")

    @property
    def requests(self) -> str:
        """Hash id -> JSON of the request its lease holder has running (endpoint, the server's
        own request id), so that whoever takes the lease over can abort it."""
        return self._key("requests")

    @property
    def counters(self) -> str:
        """Hash of run counters (written, retries, tokens, errors by class)."""
        return self._key("counters")

    @property
    def stats(self) -> str:
        """Hash of turn statistics: latency/token histograms, errors by class, waste."""
        return self._key("stats")

    @property
    def endpoint_stats(self) -> str:
        """Hash ``endpoint|name`` -> requests, tokens, errors, latency sum."""
        return self._key("endpoint_stats")

    def rate_bucket(self, bucket: int) -> str:
        """Hash of samples and tokens finished in one 10-second bucket (expires)."""
        return self._key(f"rate:{bucket}")

    @property
    def collector_lock(self) -> str:
        """String held by the one collector allowed to write this run."""
        return self._key("collector_lock")

    @property
    def retired(self) -> str:
        """JSON summary of a retired run: all that is left of it (with the hash tag, so the
        script that retires a run touches one Redis Cluster slot)."""
        return self._key("retired")

    def all_keys(self) -> list[str]:
        """Every key of the run (for deletion)."""
        names = [
            "meta", "accepted", "pending", "prompts", "results",
            "ready", "collecting", "failed", "leases", "lease_owner", "requests", "counters",
            "collector_lock", "stats", "endpoint_stats", "reaped", "producers",
            "refused_endpoints", "endpoints_out",
        ]  # fmt: skip
        return [self._key(name) for name in names]


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (SCAN MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
