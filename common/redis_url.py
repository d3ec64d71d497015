"""EagleGen's Redis URL, read the same way by every client of it.

One URL configures both redis-py (the run store) and kombu (the Celery broker, also used by
Flower), and the two read it differently: kombu takes Sentinel credentials and the database
from the first ``sentinel://`` part only, and turns a ``rediss://`` URL without ``ssl_*``
options into a connection that does not check the server's certificate. What both must agree
on is derived here, once.

Forms: ``redis://[user:password@]host:port/db``, ``rediss://…/db?ssl_cert_reqs=required&
ssl_ca_certs=/ca.pem`` (TLS) and ``sentinel://[user:password@]h1:26379;sentinel://h2:26379/db``
(with the master's name in ``EAGLEGEN_REDIS_SENTINEL_MASTER``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from common.errors import ConfigError

SENTINEL_PORT = 26379
_CERT_REQS = {
    "none": ssl.CERT_NONE, "cert_none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL, "cert_optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED, "cert_required": ssl.CERT_REQUIRED,
}  # fmt: skip
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class SentinelTarget:
    """Where the sentinels are, and the credentials and database of the master they name."""

    hosts: list[tuple[str, int]]
    username: str | None
    password: str | None = field(repr=False)  # never in a logged repr
    db: int = 0

    def broker_url(self) -> str:
        """The URL for kombu, with credentials and db on every part (kombu reads only one)."""
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        return ";".join(f"sentinel://{auth}{host}:{port}/{self.db}" for host, port in self.hosts)


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names sentinels rather than a Redis server."""
    return url.startswith("sentinel://")


def parse_sentinel(url: str) -> SentinelTarget:
    """Split ``sentinel://…;sentinel://…/db``; credentials and db may be on any one part."""
    parts = [urlsplit(part) for part in url.split(";") if part.strip()]
    if not parts or any(p.scheme != "sentinel" or not p.hostname for p in parts):
        raise ConfigError("a Sentinel URL looks like sentinel://h1:26379;sentinel://h2:26379/0")
    return SentinelTarget(
        hosts=[(str(p.hostname), p.port or SENTINEL_PORT) for p in parts],
        username=_agreed("user", [unquote(p.username) for p in parts if p.username]),
        password=_agreed("password", [unquote(p.password) for p in parts if p.password]),
        db=int(_agreed("database", [p.path.strip("/") for p in parts if p.path.strip("/")]) or 0),
    )


def _agreed(what: str, values: list[str]) -> str | None:
    if len(set(values)) > 1:
        raise ConfigError(f"the parts of the Sentinel URL name different {what}s")
    return values[0] if values else None


def sentinel_master_client(url: str, master: str | None, **options: Any) -> redis.Redis:
    """A client of the master the sentinels in ``url`` call ``master``; it follows failovers."""
    if not master:
        raise ConfigError("a sentinel:// Redis URL needs EAGLEGEN_REDIS_SENTINEL_MASTER")
    target = parse_sentinel(url)
    timeout = options.get("socket_connect_timeout")
    # Sentinels are asked without the master's password: they have their own (often none).
    sentinels = Sentinel(
        target.hosts, sentinel_kwargs={"socket_connect_timeout": timeout, "socket_timeout": timeout}
    )
    client: redis.Redis = sentinels.master_for(
        master, db=target.db, username=target.username, password=target.password, **options
    )
    return client


def broker_url(url: str) -> str:
    """The Celery broker URL for EagleGen's Redis URL."""
    return parse_sentinel(url).broker_url() if is_sentinel(url) else url


def tls_options(url: str) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for a ``rediss://`` URL; None when the URL is not TLS.

    The certificate is checked unless the URL says ``ssl_cert_reqs=none``: kombu alone would
    not check it at all, while redis-py (the run store) would.
    """
    if not url.startswith("rediss://"):
        return None
    query = dict(parse_qsl(urlsplit(url).query))
    options: dict[str, Any] = {k: v for k, v in query.items() if k.startswith("ssl_")}
    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ConfigError(f"ssl_cert_reqs must be none, optional or required, not {reqs!r}")
    options["ssl_cert_reqs"] = _CERT_REQS[reqs]
    if "ssl_check_hostname" in options:
        options["ssl_check_hostname"] = options["ssl_check_hostname"].lower() not in _FALSE
    return options


def passwords(url: str) -> list[str]:
    """Every password in ``url``, as written and percent-decoded (for redaction)."""
    found: list[str] = []
    for part in url.split(";"):
        raw = urlsplit(part.strip())
        if raw.password:
            found += [raw.password, unquote(raw.password)]
    return list(dict.fromkeys(found))
