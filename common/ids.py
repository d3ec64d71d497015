"""Idempotent sample ids: the same prompt gives the same id, whatever the row order."""

from __future__ import annotations

import hashlib
import json

ID_HEX_CHARS = 20  # 80 bits: a collision among 10^7 samples has odds below 10^-10


def sample_id(system: str | None, user_turns: list[str]) -> str:
    """Stable hash of the canonical prompt (system prompt and user turns)."""
    canonical = json.dumps(
        {"system": system or "", "user": user_turns},
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:ID_HEX_CHARS]
