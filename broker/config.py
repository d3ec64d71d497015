"""Celery settings for long LLM calls, each with the reason it is set."""

from __future__ import annotations

from typing import Any

from common.redis_url import broker_url, tls_options
from common.settings import Settings


def transport_options(settings: Settings) -> dict[str, Any]:
    """Redis transport options; every client of the broker must use the same ones."""
    options: dict[str, Any] = {
        # Longer than the longest turn plus backoff: a task running past it is redelivered
        # while still running. Leases make such a copy harmless, but it should be rare.
        "visibility_timeout": settings.effective_visibility_timeout,
        # kombu's default of 10 connections starves a threads pool: acks fail with
        # MaxConnectionsError and messages run again.
        "max_connections": settings.concurrency + 16,
        "socket_connect_timeout": 10,
        "health_check_interval": 30,
    }
    if settings.redis_sentinel_master:
        # Sentinel: the monitored master to ask the sentinels for.
        options["master_name"] = settings.redis_sentinel_master
    return options


def celery_config(settings: Settings) -> dict[str, Any]:
    """The whole Celery configuration, derived from the one Settings object."""
    options = transport_options(settings)
    return {
        "broker_url": broker_url(settings.redis_url),
        # rediss://: kombu would not check the server's certificate without this; Flower's
        # broker view needs it too.
        "broker_use_ssl": tls_options(settings.redis_url) or False,
        "broker_transport_options": options,
        "result_backend_transport_options": options,
        "visibility_timeout": options["visibility_timeout"],
        # Results go to EagleGen's own keys, not Celery's backend (which expires them in a day).
        "result_backend": None,
        "task_ignore_result": True,
        "task_default_queue": settings.queue,
        "task_serializer": "json",
        "accept_content": ["json"],
        # Ack only after the sample is stored; a killed worker's message comes back.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One message per slot: a prefetched message waits behind a 30-minute generation.
        "worker_prefetch_multiplier": 1,
        # Each slot only waits on HTTP: a thread costs a fraction of a prefork process's memory,
        # and deadlines are enforced by the client, not Celery time limits.
        "worker_pool": "threads",
        "worker_concurrency": settings.concurrency,
        "broker_pool_limit": settings.concurrency + 8,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # True kills every in-flight generation on a Redis blip, wasting their GPU time; the
        # leases and the idempotent store already cover a lost connection.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Task events cost a PUBLISH per state change; only Flower's task views read them.
        # Their arguments are (run, sample id), never prompts or secrets.
        "worker_send_task_events": settings.task_events,
        # A "sent" event per task doubles the producer's Redis writes; Flower shows tasks from
        # their "received" event on.
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
    }
