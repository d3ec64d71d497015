"""Logging set-up: one format, secrets redacted from every record."""

from __future__ import annotations

import logging

from common.redact import redact
from common.redis_url import passwords
from common.settings import Settings


class RedactingFilter(logging.Filter):
    """Rewrites each record's message with URL passwords and known secrets masked."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def secrets_of(settings: Settings) -> list[str]:
    """The secret strings a process must never print."""
    found = [settings.api_key.get_secret_value()] if settings.api_key else []
    # Every part of a Sentinel URL, and both the written and the percent-decoded form.
    return [*found, *passwords(settings.redis_url)]


# One line per task (Celery's "received" and "succeeded") or per request (httpx): at INFO they
# would be most of a long run's log. Shown only at DEBUG; their
# problems (task failures, errors) are warnings and still show, with the per-minute summary
# at INFO.
CHATTY = ("celery.app.trace", "celery.worker.strategy", "httpx", "httpx2")


def setup_logging(settings: Settings, level: str = "INFO") -> None:
    """Configure the root logger once per process (per-task and per-request lines at DEBUG)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(secrets_of(settings)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    chatty = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in CHATTY:
        logging.getLogger(name).setLevel(chatty)
