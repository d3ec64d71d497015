"""The one place that talks HTTP to an OpenAI-compatible server.

A thin client: the request body is one ``json.dumps``, the HTTP is :mod:`worker.transport`
(keep-alive connections on ``http.client``) and the stream is read by one decoder
(:class:`TurnStream`), bytes in, the turn out. The openai SDK's request building cost about 1 ms
per request, its line reader about 15 us per streamed token, httpx's HTTP layer about 18 us per
streamed token (bench/bench_client.py). Requests are streamed: the read timeout is the stall
timeout (no byte for N seconds), so a slow generation that keeps producing tokens is never cut,
while a dead stream is noticed. Transport errors and HTTP statuses are translated here, once,
into the EagleGen exception tree.

Token ids (vLLM's ``return_token_ids``) are asked for per ``Settings.token_ids``; whether an
endpoint gives them is learned from its first answers and remembered (:class:`IdSupport`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from common import errors
from common.models import GenParams, TurnResult, Usage
from common.settings import Settings
from worker import transport
from worker.reasoning import finish_text

Messages = list[dict[str, Any]]
Check = Callable[[], None]
# The JSON scanner at an offset (json.loads would first copy the payload out and re-check it).
_scan = json.JSONDecoder().raw_decode


@contextmanager
def translate_errors(endpoint: str) -> Iterator[None]:
    """Map transport exceptions and undecodable bodies to transient EagleGen errors."""
    try:
        yield
    except errors.EagleGenError:
        raise
    except transport.ConnectTimeout as exc:
        raise errors.TimeoutError_(f"{endpoint}: timed out connecting") from exc
    except transport.ReadTimeout as exc:
        raise errors.StallError(f"{endpoint}: stream stalled (no data within the timeout)") from exc
    except transport.Dropped as exc:
        raise errors.Disconnected(f"{endpoint}: connection dropped mid-response: {exc}") from exc
    except transport.ConnectFailed as exc:
        raise errors.ConnectError(f"{endpoint}: cannot connect: {exc}") from exc
    except ValueError as exc:  # a body that is not OpenAI JSON
        raise errors.BadResponse(f"{endpoint}: response is not OpenAI JSON: {exc}") from exc


def status_error(status: int, body: bytes, endpoint: str) -> errors.GenerationError:
    """The EagleGen error of an HTTP error status, with the server's message."""
    text = f"{endpoint}: HTTP {status}: {_short(_error_message(body))}"
    if status == 429:
        return errors.RateLimited(text)
    if status >= 500 or status in (408, 409):
        return errors.ServerError(text)
    if status in (401, 403):
        return errors.AuthError(text)
    if status == 404:
        return errors.NotFound(text)
    if status >= 400:
        return errors.BadRequest(text)
    return errors.BadResponse(text)  # a redirect or an odd 2xx: not an OpenAI server


def _error_message(body: bytes) -> str:
    """The message of an OpenAI/vLLM error body, else the body as text."""
    try:
        found = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    error = found.get("error", found) if isinstance(found, dict) else found
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


def _short(message: str, limit: int = 300) -> str:
    return " ".join(message.split())[:limit]


class IdSupport:
    """Whether to ask an endpoint for token ids, learned from its answers.

    ``auto`` asks until the endpoint answers without ids or refuses the field, then stops
    asking it; ``on`` always asks and fails the sample when ids are missing; ``off`` never asks.
    """

    def __init__(self, mode: str, endpoint: str) -> None:
        self.mode = mode
        self.endpoint = endpoint
        self.known: bool | None = False if mode == "off" else None

    def ask(self) -> bool:
        """Whether the next request asks for ids; in ``on`` mode, fails on a known refuser."""
        if self.mode == "on" and self.known is False:
            raise self._missing("gives no token ids")
        return self.known is not False

    def refused(self, exc: errors.BadRequest) -> bool:
        """A 400 naming the field: in auto, remember and return True (ask again without it)."""
        if "return_token_ids" not in str(exc):
            return False
        self.known = False
        if self.mode == "on":
            raise self._missing("refuses return_token_ids") from exc
        return True

    def answered(self, turn: TurnResult) -> None:
        """Learn from a finished turn; in ``on`` mode a turn without ids fails."""
        has_ids = turn.prompt_token_ids is not None
        if self.known is None:
            self.known = has_ids
        if self.mode == "on" and not has_ids:
            exc = self._missing("answered without token ids")
            exc.tokens_streamed = turn.usage.completion_tokens  # generated for nothing
            raise exc

    def _missing(self, what: str) -> errors.NoTokenIds:
        exc = errors.NoTokenIds(
            f"{self.endpoint} {what} and EAGLEGEN_TOKEN_IDS=on requires them (a vLLM with "
            "return_token_ids does; or set EAGLEGEN_TOKEN_IDS=auto to keep text only)"
        )
        exc.endpoint = self.endpoint
        return exc


class ChatClient:
    """A streaming chat-completions client for one endpoint; safe to share across threads."""

    def __init__(self, endpoint: str, settings: Settings) -> None:
        self.endpoint = endpoint
        self._settings = settings
        self._model = settings.model
        self._model_lock = threading.Lock()
        self.ids = IdSupport(settings.token_ids, endpoint)
        self._chat_url = f"{endpoint}/chat/completions"
        self._models_url = f"{endpoint}/models"
        headers = {
            "Authorization": f"Bearer {settings.api_key_value()}",  # vLLM expects one, even unset
            "Content-Type": "application/json",
        }
        self._http = transport.Connections(
            endpoint, headers, settings.connect_timeout, settings.stall_timeout,
            max_idle=settings.concurrency,
        )  # fmt: skip

    def model(self) -> str:
        """The model to ask for: configured, or the first one the server lists."""
        with self._model_lock:
            if self._model is None:
                listed = self._models()
                if not listed:
                    raise errors.NotFound(f"{self.endpoint}: /v1/models lists no model")
                self._model = str(listed[0]["id"])
            return self._model

    def probe(self, timeout: float) -> None:
        """One cheap request (GET /models) that raises the EagleGen error if the server is down."""
        self._models(timeout)

    def _models(self, timeout: float | None = None) -> list[dict[str, Any]]:
        with translate_errors(self.endpoint):
            status, content = self._http.get(self._models_url, timeout=timeout)
            if status != 200:
                raise status_error(status, content, self.endpoint)
            data = json.loads(content).get("data")
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def complete(
        self, messages: Messages, params: GenParams, check: Check | None = None
    ) -> TurnResult:
        """Generate one assistant turn; ``check`` runs per network read and may raise to abort."""
        model = self.model()
        ask = self.ids.ask()
        try:
            turn = self._turn(chat_body(model, messages, params, ask), model, check)
        except errors.BadRequest as exc:
            if not (ask and self.ids.refused(exc)):
                raise
            turn = self._turn(chat_body(model, messages, params, False), model, check)
        self.ids.answered(turn)
        return turn

    def _turn(self, body: bytes, model: str, check: Check | None) -> TurnResult:
        started = time.monotonic()
        deadline = started + self._settings.max_request_time
        stream = TurnStream(self.endpoint)
        try:
            with (
                translate_errors(self.endpoint),
                self._http.stream("POST", self._chat_url, content=body) as response,
            ):
                if response.status_code != 200:
                    raise status_error(response.status_code, response.read(), self.endpoint)
                # Read to the end of the body, past [DONE]: a response left unread closes its
                # connection, and every request would pay a new one (the server too).
                for data in response.iter_raw():
                    stream.feed(data)
                    if check is not None:
                        check()
                    if time.monotonic() > deadline:
                        raise errors.TimeoutError_(f"{self.endpoint}: turn exceeded max time")
            return stream.result(time.monotonic() - started, model)
        except errors.GenerationError as exc:
            exc.endpoint = exc.endpoint or self.endpoint
            exc.tokens_streamed = stream.tokens()
            raise

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


def chat_body(model: str, messages: Messages, params: GenParams, token_ids: bool) -> bytes:
    """The JSON body of one streamed chat completion."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if params.chat_template_kwargs:
        body["chat_template_kwargs"] = params.chat_template_kwargs
    if token_ids:
        body["return_token_ids"] = True
    return json.dumps(body, ensure_ascii=False).encode()


class TurnStream:
    """One streamed chat completion read from its bytes: events, deltas, ids, usage.

    The one decoder of a stream. Each read's complete events are decoded to text once, split
    on blank lines, and each ``data: {...}`` payload is parsed in place by the JSON scanner
    (``raw_decode`` at its offset: no slice, no line objects, no per-chunk objects); deltas are
    appended to lists. Other event shapes (several ``data`` lines, comments, CRLF framing)
    take a slower general path. The CPU per token bounds how many streams a worker holds.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.done = False  # [DONE] seen: what follows is read (keep-alive) but not parsed
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.token_ids: list[int] = []
        self.prompt_token_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.text_chunks = 0
        self._rest = b""

    def feed(self, data: bytes) -> None:
        """Parse the events that arrived; an incomplete one waits for the next read."""
        if self.done:
            return
        buf = self._rest + data if self._rest else data
        if b"\r" in buf:  # CRLF framing; a CR at the end of a read meets its LF next time
            buf = buf.replace(b"\r\n", b"\n")
        cut = buf.rfind(b"\n\n") + 2
        if cut < 2:
            self._rest = buf
            return
        self._rest = buf[cut:]
        # Whole events only: no UTF-8 character is split at the cut.
        text = (buf[:cut] if cut < len(buf) else buf).decode()
        start = 0
        while not self.done:
            end = text.find("\n\n", start)
            if end < 0:
                break
            if text.startswith("data: {", start) and text.find("\n", start, end) < 0:
                chunk, stop = _scan(text, start + 6)  # how every server sends chunks
                if stop != end and (stop > end or text[stop:end].strip()):
                    raise ValueError(f"an event is not one JSON object: {text[start:end][:99]!r}")
                self._add(chunk)
            else:
                self._event(text[start:end])
            start = end + 2

    def _event(self, block: str) -> None:
        payload = _data_field(block)
        if payload is None:
            return
        if payload.strip() == "[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            raise ValueError(f"a stream event is not a JSON object: {payload[:80]!r}")
        self._add(chunk)

    def _add(self, chunk: dict[str, Any]) -> None:
        choices = chunk.get("choices")
        if choices:
            for choice in choices:
                self._add_choice(choice)
        elif chunk.get("error"):
            message = f"{self.endpoint}: error in the stream: {chunk['error']}"
            raise errors.ServerError(message[:400])
        prompt = chunk.get("prompt_token_ids")
        if prompt is not None:
            self.prompt_token_ids = prompt
        usage = chunk.get("usage")
        if usage:
            self.usage = usage

    def _add_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if delta:
            text = delta.get("content")
            if text:
                self.content.append(text)
            # vLLM now sends `reasoning`; SGLang and older vLLM `reasoning_content`.
            thought = delta.get("reasoning") or delta.get("reasoning_content")
            if thought:
                self.reasoning.append(thought)
            if text or thought:
                self.text_chunks += 1
        ids = choice.get("token_ids")
        if ids:
            self.token_ids += ids
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = reason

    def tokens(self) -> int:
        """Tokens received so far: the ids where given, else ~1 per text chunk."""
        return len(self.token_ids) or self.text_chunks

    def result(self, latency: float, model: str) -> TurnResult:
        """The finished turn; a stream without a finish or with an empty answer is an error."""
        if self.finish_reason is None:
            raise errors.Disconnected(f"{self.endpoint}: stream ended without a finish_reason")
        reasoning, content = finish_text("".join(self.content), "".join(self.reasoning) or None)
        if not content.strip() and not reasoning and self.finish_reason != "length":
            raise errors.EmptyResponse(f"{self.endpoint}: the model returned an empty answer")
        with_ids = self.prompt_token_ids is not None
        usage = Usage(
            prompt_tokens=self.usage.get("prompt_tokens") or 0,
            completion_tokens=self.usage.get("completion_tokens") or 0,
        )
        return TurnResult(
            content=content, reasoning=reasoning, finish_reason=self.finish_reason, usage=usage,
            latency_s=round(latency, 3), endpoint=self.endpoint, model=model,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=self.token_ids if with_ids else None,
        )  # fmt: skip


def _data_field(block: str) -> str | None:
    """The data of a general server-sent event: its ``data`` lines joined; None if it has none.

    Comments (``:``) and other fields (``event``, ``id``, ``retry``) are skipped.
    """
    lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
    return "\n".join(lines) if lines else None
