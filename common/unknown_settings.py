"""``EAGLEGEN_*`` variables that no setting reads: a typo (``EAGLEGEN_ENDPOINT``) would
otherwise be ignored in silence and the default used."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from common.settings import Settings

PREFIX = "EAGLEGEN_"
# Read by the Makefile, compose files and test tiers, not by the settings object.
TOOLING_PREFIXES = ("TEST_", "BENCH_", "VLLM_", "TLS_", "COMPOSE_")
TOOLING = frozenset(
    [
        "ENV_FILE",
        "GID",
        "UID",
        "IMAGE",
        "INPUT_DIR",
        "OUT_DIR",
        "SOURCE",
        "STATE_DIR",
        "REDIS_MAXMEMORY",
        "TRAINERS_VENV",
        "CAPACITY_REDIS_URL",
    ]
)


def unknown_settings(environ: Mapping[str, str]) -> str | None:
    """One warning line naming each unknown ``EAGLEGEN_*`` variable and the closest known one."""
    known = [PREFIX + name.upper() for name in Settings.model_fields]
    found = []
    for name in sorted(environ):
        rest = name[len(PREFIX) :]
        if not name.startswith(PREFIX) or name in known:
            continue
        if rest in TOOLING or rest.startswith(TOOLING_PREFIXES):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        found.append(f"{name} (did you mean {close[0]}?)" if close else name)
    if not found:
        return None
    return f"warning: ignored, no such setting: {', '.join(found)}"
