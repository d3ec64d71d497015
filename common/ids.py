"""Idempotent sample ids: the same prompt gives the same id, whatever the row order."""

from __future__ import annotations

import hashlib
import json

ID_HEX_CHARS = 20  # 80 bits: a collision among 10^7 samples has odds below 10^-10


def sample_id(system: str | None, user_turns: list[str], tools: object = None) -> str:
    """Stable hash of the canonical prompt (system prompt and user turns).

    ``tools``: what else a tool-calling sample is (its tools and source messages), so that the
    same question with other tools is another sample; None leaves other ids as they were.
    """
    fields: dict[str, object] = {"system": system or "", "user": user_turns}
    if tools is not None:
        fields["tools"] = tools
    canonical = json.dumps(
        fields,
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:ID_HEX_CHARS]
