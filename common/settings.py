"""One settings object per process, read from ``EAGLEGEN_*`` variables (and ``.env``).

Nothing here runs at import: callers build ``Settings()`` once at start-up and pass it down.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from common.redis_url import is_sentinel

RUN_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Settings(BaseSettings):
    """Every knob of EagleGen; field ``foo`` is the variable ``EAGLEGEN_FOO``."""

    # env_ignore_empty: an empty variable means unset (docker compose passes `VAR: ""` for an
    # unset optional value; EAGLEGEN_MODEL="" must still mean "ask the server").
    model_config = SettingsConfigDict(
        env_prefix="EAGLEGEN_", env_file=".env", env_file_encoding="utf-8", extra="ignore",
        env_ignore_empty=True,
    )  # fmt: skip

    # Where things are.
    # May hold a password: kept out of repr() (and so out of logged settings).
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", repr=False)
    # The monitored master's name when redis_url lists sentinels.
    redis_sentinel_master: str | None = None
    endpoints: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000/v1"]
    )
    model: str | None = None
    api_key: SecretStr | None = None
    run: str = "default"
    queue: str = "eaglegen"
    key_prefix: str = "eaglegen"

    # Worker.
    concurrency: int = Field(default=32, ge=1)
    connect_timeout: float = Field(default=10.0, gt=0)
    # No byte for this long means the stream is dead. Queue time on a busy server counts too,
    # so it must be generous; a slow but progressing generation never hits it.
    stall_timeout: float = Field(default=300.0, gt=0)
    # Hard ceiling for one assistant turn, however steadily it streams: connect, response head
    # and body together.
    max_request_time: float = Field(default=3600.0, gt=0)
    # The whole of each short request: GET /models, probes, /metrics reads, and an error
    # status's body (its first few KB are kept for the message).
    probe_timeout: float = Field(default=10.0, gt=0)
    # After [DONE] and a finish, the rest of a body gets this long to end; one that does not
    # has its connection closed, and the turn is kept.
    drain_timeout: float = Field(default=2.0, gt=0)
    # One server-sent event at most; past it the answer is a BadResponse. The biggest event
    # is the one with a long prompt's ids (about 6 bytes per token).
    max_event_bytes: int = Field(default=16 << 20, ge=1024)
    # Ask servers for token ids (vLLM's return_token_ids) and keep them in the records. auto:
    # where an endpoint gives them (learned per endpoint); on: a server without them fails the
    # sample (permanently); off: never ask.
    token_ids: Literal["auto", "on", "off"] = "auto"
    # While a turn streams, what it generated since the last save is appended under the lease
    # every this many tokens or seconds (whichever first), and when the stream breaks; a sample
    # that runs again continues from it (docs/resume.md). 0 tokens: no periodic saves.
    checkpoint_tokens: int = Field(default=32, ge=0)
    checkpoint_seconds: float = Field(default=2.0, gt=0)
    # Continue a broken turn from its checkpoint (auto), or generate it again from the start.
    resume: Literal["auto", "off"] = "auto"
    max_retries: int = Field(default=8, ge=0)
    # Takes of one sample's lease at most, whatever ended them (retries, redeliveries, dead or
    # looping workers): past it the take fails the sample as attempts_exhausted. Unset:
    # 3 × (EAGLEGEN_MAX_RETRIES + 1).
    max_attempts: int | None = Field(default=None, ge=1)
    backoff_base: float = Field(default=2.0, gt=0)
    backoff_max: float = Field(default=300.0, gt=0)
    # A dead worker's samples run again within lease_ttl + reconcile_interval (about a minute).
    lease_ttl: float = Field(default=45.0, gt=0)
    reconcile_interval: float = Field(default=15.0, gt=0)
    # Celery's retry delays and kombu's delivery times run on the workers' own clocks; a worker
    # further than this from Redis's clock warns in its log and in `status` (run NTP).
    max_clock_skew: float = Field(default=2.0, gt=0)
    # Queued messages a reconciler pass reads at most (each is parsed): above it, the pass skips
    # the queue (see worker/pipeline/reconcile.py), so its cost does not grow with max_pending.
    reconcile_scan_max: int = Field(default=20_000, ge=0)
    # After SIGTERM, in-flight generations get this long to finish before being handed back.
    shutdown_grace: float = Field(default=20.0, ge=0)
    # None: derived from the longest turn plus backoff (see ``effective_visibility_timeout``).
    visibility_timeout: int | None = None

    # Endpoint capacity, shared by every worker through Redis (worker/endpoints/capacity.py).
    max_inflight: int = Field(default=64, ge=1)  # requests at once per endpoint, cluster-wide
    # "URL=N,URL=N": per-endpoint overrides of max_inflight.
    endpoint_caps: Annotated[dict[str, Annotated[int, Field(ge=1)]], NoDecode] = Field(
        default_factory=dict
    )
    slot_ttl: float = Field(default=30.0, gt=0)  # a dead holder's slot frees itself after this
    endpoint_failures: int = Field(default=5, ge=1)  # in a row before a cool-down
    endpoint_cooldown: float = Field(default=10.0, gt=0)  # doubles after each failed probe
    adaptive: bool = (
        False  # move each cap from the server's /metrics (worker/endpoints/adaptive.py)
    )
    adaptive_interval: float = Field(default=2.0, gt=0)
    adaptive_max_inflight: int = Field(default=1024, ge=1)
    adaptive_headroom: float = Field(default=0.1, ge=0, le=1)  # waiting allowed / running
    # Routing (worker/endpoints/routing.py): "cache" sends a conversation's later turns (and resumed
    # samples) back to the server holding their prefix, first turns by a hash of their
    # leading prefix; "least-loaded" takes the endpoint with the most free slots.
    routing: Literal["cache", "least-loaded"] = "cache"
    # Seconds a later turn waits for its previous server when that one is full, before it
    # goes to the least loaded (a drained or failing server is never waited for).
    affinity_wait: float = Field(default=2.0, ge=0)
    # A preferred endpoint is taken while its load stays within this x the mean (by caps).
    affinity_load_bound: float = Field(default=1.25, ge=1.0)
    rpm: int | None = Field(default=None, ge=1)  # requests per minute, cluster-wide
    tpm: int | None = Field(default=None, ge=1)  # prompt + completion tokens per minute

    # Celery task events (a PUBLISH per task state change): only Flower's task views need them.
    # Off, Flower still turns them on in running workers (its enable_events broadcast, every
    # 5 s); on, a worker sends them from its start (docker-compose.yml, which runs Flower).
    task_events: bool = False

    # Prometheus: a worker serves its request metrics here when set (0 = off).
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"

    # Producer. Samples waiting in Redis (queued, pending or running), at most this many.
    max_pending: int = Field(default=10_000, ge=1)
    # And about this many bytes of prompts waiting (the enqueue's mean sample size times the
    # pending count): a sixth of a 24 GB Redis, leaving room for records, checkpoints, a fork.
    max_pending_bytes: int = Field(default=4 << 30, ge=1 << 20)
    # A source row (a JSONL line, or a sample's text) longer than this is an invalid row.
    max_row_bytes: int = Field(default=4 << 20, ge=1024)

    # Seconds a finished answer's store is retried through a Redis blip before giving up.
    store_retry_s: float = Field(default=60.0, ge=0)

    # Collector.
    collect_batch: int = Field(default=256, ge=1)
    # Renewed on every loop turn (at least once a second); short so that a killed collector's
    # successor waits seconds, not minutes.
    collector_lock_ttl: float = Field(default=10.0, gt=0)

    # Hidden-state capture (capture/).
    # The Celery queue capture tasks go to and capture workers serve.
    capture_queue: str = "eaglegen-capture"
    # Padded tokens (rows x the longest) one forward pass of a capture worker takes at most.
    capture_token_budget: int = Field(default=8192, ge=1)
    capture_linger: float = Field(default=0.02, ge=0)  # seconds a capture batch waits to fill
    # vLLM backend (capture/vllm_backend.py): the eagle_aux_hidden_state_layer_ids the capture
    # servers were started with, "i,j,k,L" (unset: exactly the ones the run's layout needs).
    capture_server_layers: str | None = None
    # Seconds a row waits for the server's hidden-state file to be whole (its .lock released).
    capture_lock_timeout: float = Field(default=120.0, gt=0)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _split_endpoints(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip().rstrip("/") for part in value.split(",") if part.strip()]
        return value

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one endpoint is needed")
        for url in value:
            _check_endpoint(url)
        return [url.rstrip("/") for url in value]

    @field_validator("endpoint_caps", mode="before")
    @classmethod
    def _parse_caps(cls, value: object) -> object:
        if isinstance(value, str):
            pairs = [part.rsplit("=", 1) for part in value.split(",") if part.strip()]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError("endpoint caps must look like URL=N,URL=N")
            return {url.strip().rstrip("/"): cap.strip() for url, cap in pairs}
        return value

    def cap_for(self, endpoint: str) -> int:
        """The configured in-flight cap of one endpoint (before any adaptive change)."""
        return self.endpoint_caps.get(endpoint, self.max_inflight)

    @model_validator(mode="after")
    def _check_sentinel_master(self) -> Settings:
        if is_sentinel(self.redis_url) and not self.redis_sentinel_master:
            raise ValueError("a sentinel:// redis_url needs EAGLEGEN_REDIS_SENTINEL_MASTER")
        return self

    @field_validator("run")
    @classmethod
    def _check_run(cls, value: str) -> str:
        return check_run_name(value)

    @property
    def effective_visibility_timeout(self) -> int:
        """Seconds before Redis redelivers an unacked task; longer than any turn plus backoff."""
        if self.visibility_timeout is not None:
            return self.visibility_timeout
        return int(self.max_request_time + self.backoff_max + 600)

    def attempts_ceiling(self) -> int:
        """How many times a sample's lease may be taken before the take fails it."""
        return self.max_attempts or 3 * (self.max_retries + 1)

    def api_key_value(self) -> str:
        """The API key for the HTTP client; 'EMPTY' as vLLM expects when none is set."""
        return self.api_key.get_secret_value() if self.api_key else "EMPTY"


def check_run_name(value: str) -> str:
    """Validate a run name (it becomes part of Redis keys and file names)."""
    if not RUN_NAME.match(value):
        raise ValueError(f"run name {value!r} must be 1-64 letters, digits, '_', '.' or '-'")
    return value


def _check_endpoint(url: str) -> None:
    """One endpoint of EAGLEGEN_ENDPOINTS: an http(s) URL with a host, ending in /v1."""
    if any(c.isspace() for c in url) or url.count("://") > 1:
        # "URL URL" (or "URL;URL") would otherwise pass as one URL and be sent nowhere.
        raise ValueError(
            f"endpoint {url!r} is not one URL: EAGLEGEN_ENDPOINTS is a comma-separated list "
            "of URLs (URL,URL)"
        )
    if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
        raise ValueError(f"endpoint {url!r} must be an http(s) URL ending in /v1")
    parts = urlsplit(url)
    if parts.query or parts.fragment or ";" in parts.path:
        raise ValueError(f"endpoint {url!r} must be an http(s) URL ending in /v1")
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number in range)
    except ValueError:
        raise ValueError(f"endpoint {url!r} has no valid port") from None
    if not parts.hostname:
        raise ValueError(f"endpoint {url!r} names no host")
    if "@" in parts.netloc:  # would be sent nowhere, and named everywhere
        where = f"{parts.scheme}://***@{parts.netloc.rpartition('@')[2]}{parts.path}"
        raise ValueError(
            f"endpoint {where} holds credentials (user:password@): remove them and "
            "set EAGLEGEN_API_KEY instead"
        )
