"""Keep secrets out of anything printed or logged."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z+]+://)(?P<user>[^:@/\s]*):(?P<pw>[^@/\s]+)@")
# A bearer token quoted back by a server (its error echoing our Authorization header).
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host``."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url)


def redact(text: str, secrets: list[str]) -> str:
    """Replace every URL password and every given secret in ``text`` with ``***``."""
    text = _BEARER.sub(r"\1***", redact_url(text))
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text
