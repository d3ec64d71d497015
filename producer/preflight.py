"""What the servers allow, asked before a run is created: each model's ``max_model_len``.

vLLM's ``GET /v1/models`` lists ``max_model_len`` (prompt + completion tokens) per model. A
run whose ``max_tokens`` leaves no room for a prompt is refused at ``enqueue``; a row whose
first prompt cannot fit beside ``max_tokens`` is skipped and counted, rather than sent to fail
with a 400 on every attempt. Servers that do not answer (not started yet) leave the run
unchecked, with a warning: the workers' own errors still apply then.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from common.errors import InvalidParams
from common.models import GenParams
from common.redact import redact_url

TIMEOUT_S = 5.0
# The share of a source's first prompts a suggested --max-tokens leaves room for (a few very
# long rows are skipped rather than shrink every answer).
ROOM_SHARE = 0.95
# Rows read to estimate a source's prompts for that suggestion.
SAMPLE_ROWS = 1000
# Tokens a chat template adds around each message (role header, end-of-turn), at least.
PER_MESSAGE_TOKENS = 4


@dataclass(frozen=True)
class ServerLimits:
    """The smallest ``max_model_len`` among the endpoints that gave one, and who did not."""

    max_model_len: int | None
    unchecked: list[str]  # "URL: why", for endpoints that did not answer or list no limit


def prompt_estimate(system: str | None, user_turns: Sequence[str]) -> int:
    """A lower bound of a first turn's prompt tokens: a token per whitespace word, plus the
    template's per-message tokens (no tokenizer splits fewer tokens from a text)."""
    texts = [t for t in (system, user_turns[0] if user_turns else "") if t]
    return sum(len(t.split()) + PER_MESSAGE_TOKENS for t in texts) or PER_MESSAGE_TOKENS


def server_limits(
    endpoints: Sequence[str], model: str | None, api_key: str, timeout: float = TIMEOUT_S
) -> ServerLimits:
    """Ask every endpoint's ``/v1/models`` for the served model's ``max_model_len``."""
    lengths: list[int] = []
    unchecked: list[str] = []
    answers = _ask_all(endpoints, model, api_key, timeout)
    for url in endpoints:
        found = answers.get(url, TimeoutError(f"no answer within {timeout:.0f} s"))
        if isinstance(found, Exception):
            unchecked.append(f"{redact_url(url)}: {_reason(found)}")
            continue
        if found is None:
            unchecked.append(f"{redact_url(url)}: /v1/models gives no max_model_len")
        else:
            lengths.append(found)
    return ServerLimits(min(lengths) if lengths else None, unchecked)


def check_max_tokens(
    params: GenParams, limits: ServerLimits, prompts: Callable[[], Sequence[int]] = tuple
) -> None:
    """Refuse ``max_tokens`` that leaves no room for any prompt (one line), with a value that
    leaves room for most of ``prompts`` (their estimates, asked for only then)."""
    limit = limits.max_model_len
    if limit is not None and params.max_tokens + PER_MESSAGE_TOKENS > limit:
        raise InvalidParams(
            f"--max-tokens {params.max_tokens} does not fit the servers' max_model_len {limit} "
            f"(prompt + completion tokens, from GET /v1/models): {advice(limit, prompts())}"
        )


def advice(max_model_len: int, prompts: Sequence[int]) -> str:
    """The largest ``--max-tokens`` that leaves room for most first prompts (``prompts``:
    their estimates), said in words."""
    if not prompts:
        return f"use at most {max_model_len - PER_MESSAGE_TOKENS - 1}, leaving room for a prompt"
    ranked = sorted(prompts)
    longest = ranked[max(0, math.ceil(ROOM_SHARE * len(ranked)) - 1)]
    room = max_model_len - longest
    share = f"{ROOM_SHARE:.0%} of the {len(ranked)} first prompts read"
    if room < 1:
        return f"{share} take {longest} tokens or more: no --max-tokens leaves them room"
    return f"use at most {room}: it leaves room for {share} (by a lower bound of their tokens)"


def _ask_all(
    endpoints: Sequence[str], model: str | None, api_key: str, timeout: float
) -> dict[str, int | Exception | None]:
    """Every endpoint asked at once, all within ``timeout`` (a server that trickles its answer
    byte by byte would pass any per-read timeout): what each said, or its error. Daemon
    threads, so one that never answers does not keep the command from exiting."""
    answers: dict[str, int | Exception | None] = {}

    def ask(url: str) -> None:
        try:
            answers[url] = _max_model_len(url, model, api_key, timeout)
        except Exception as exc:  # any failure is this endpoint's reason, said in enqueue's
            answers[url] = exc  # one line (raised in the thread it printed a traceback)

    threads = [threading.Thread(target=ask, args=(url,), daemon=True) for url in endpoints]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(answers)


def _max_model_len(url: str, model: str | None, api_key: str, timeout: float) -> int | None:
    request = urllib.request.Request(
        f"{url}/models", headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read(1 << 20))
    cards = body.get("data") if isinstance(body, dict) else None
    if not isinstance(cards, list):
        raise ValueError("/v1/models is not a model list")
    cards = [c for c in cards if isinstance(c, dict)]
    chosen = next((c for c in cards if c.get("id") == model), None) if model else None
    card = chosen or (cards[0] if cards and model is None else None)
    value = card.get("max_model_len") if card else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reason(exc: Exception) -> str:
    """Why an endpoint gave no limit, on one line (a server's text may hold line breaks)."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        text = str(exc.reason)
    elif isinstance(exc, OSError | ValueError):
        text = str(exc)
    else:  # http.client's protocol errors say little without their name
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:200]
