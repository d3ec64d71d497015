"""The one place that talks HTTP to an OpenAI-compatible server.

Requests are streamed: httpx's read timeout is the stall timeout (no byte for N seconds), so a
slow generation that keeps producing tokens is never cut, while a dead stream is noticed.
Errors from openai/httpx are translated here, once, into the EagleGen exception tree.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx2 as httpx  # the HTTP library openai 3.x is built on
import openai

from common import errors
from common.models import GenParams, TurnResult, Usage
from common.settings import Settings
from worker.reasoning import delta_reasoning, finish_text

Messages = list[dict[str, Any]]


@contextmanager
def translate_errors(endpoint: str) -> Iterator[None]:
    """Map openai/httpx exceptions to transient or permanent EagleGen errors."""
    try:
        yield
    except errors.EagleGenError:
        raise
    except openai.APIStatusError as exc:
        raise _status_error(exc.status_code, _short(exc), endpoint) from exc
    except (openai.APITimeoutError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise errors.TimeoutError_(f"{endpoint}: timed out connecting") from exc
    except httpx.ReadTimeout as exc:
        raise errors.StallError(f"{endpoint}: stream stalled (no data within the timeout)") from exc
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        raise errors.Disconnected(f"{endpoint}: connection dropped mid-response: {exc}") from exc
    except openai.APIConnectionError as exc:
        raise errors.ConnectError(f"{endpoint}: cannot connect: {exc.__cause__ or exc}") from exc
    except openai.APIError as exc:  # an error event inside the stream
        raise errors.ServerError(f"{endpoint}: {_short(exc)}") from exc
    except ValueError as exc:  # a body that is not JSON
        raise errors.BadResponse(f"{endpoint}: response is not OpenAI JSON: {exc}") from exc


def _status_error(status: int, message: str, endpoint: str) -> errors.GenerationError:
    text = f"{endpoint}: HTTP {status}: {message}"
    if status == 429:
        return errors.RateLimited(text)
    if status >= 500 or status in (408, 409):
        return errors.ServerError(text)
    if status in (401, 403):
        return errors.AuthError(text)
    if status == 404:
        return errors.NotFound(text)
    return errors.BadRequest(text)


def _short(exc: Exception, limit: int = 300) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return " ".join(str(message).split())[:limit]


class ChatClient:
    """A streaming chat-completions client for one endpoint; safe to share across threads."""

    def __init__(self, endpoint: str, settings: Settings) -> None:
        self.endpoint = endpoint
        self._settings = settings
        self._model = settings.model
        self._model_lock = threading.Lock()
        timeout = httpx.Timeout(
            connect=settings.connect_timeout, read=settings.stall_timeout, write=60.0, pool=60.0
        )
        limits = httpx.Limits(
            max_connections=settings.concurrency + 8, max_keepalive_connections=settings.concurrency
        )
        self._client = openai.OpenAI(
            base_url=endpoint,
            api_key=settings.api_key_value(),
            max_retries=0,  # Celery owns retries; SDK retries would multiply with them
            timeout=timeout,
            http_client=httpx.Client(timeout=timeout, limits=limits),
        )

    def model(self) -> str:
        """The model to ask for: configured, or the first one the server lists."""
        with self._model_lock:
            if self._model is None:
                with translate_errors(self.endpoint):
                    models = self._client.models.list().data
                if not models:
                    raise errors.NotFound(f"{self.endpoint}: /v1/models lists no model")
                self._model = models[0].id
            return self._model

    def probe(self, timeout: float) -> None:
        """One cheap request (GET /models) that raises the EagleGen error if the server is down."""
        with translate_errors(self.endpoint):
            self._client.with_options(timeout=timeout).models.list()

    def complete(
        self, messages: Messages, params: GenParams, check: Callable[[], None] | None = None
    ) -> TurnResult:
        """Generate one assistant turn; ``check`` runs per chunk and may raise to abort."""
        model = self.model()
        started = time.monotonic()
        deadline = started + self._settings.max_request_time
        acc = _Accumulator()
        try:
            with translate_errors(self.endpoint):
                request = self._request(model, messages, params)
                raw = self._client.chat.completions.with_streaming_response.create(**request)
                with raw as response:
                    lines = response.iter_lines()
                    for chunk in sse_chunks(lines, self.endpoint):
                        acc.add(chunk)
                        if check is not None:
                            check()
                        if time.monotonic() > deadline:
                            raise errors.TimeoutError_(f"{self.endpoint}: turn exceeded max time")
                    # Read past [DONE] to the end of the body: a response left unread closes its
                    # connection, and every request would pay a new one (the server too).
                    for _ in lines:
                        pass
            return acc.result(time.monotonic() - started, self.endpoint, model)
        except errors.GenerationError as exc:
            exc.endpoint = exc.endpoint or self.endpoint
            exc.tokens_streamed = acc.text_chunks  # ~1 token per chunk when streaming
            raise

    def _request(self, model: str, messages: Messages, params: GenParams) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params.chat_template_kwargs:
            request["extra_body"] = {"chat_template_kwargs": params.chat_template_kwargs}
        return request

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


class _Fields(dict[str, Any]):
    """A parsed chunk whose keys read as attributes, absent ones as None (as SDK objects do)."""

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def sse_chunks(lines: Iterable[str], endpoint: str) -> Iterator[Any]:
    """The JSON chunks of a server-sent-events stream, up to ``[DONE]``.

    Parsed with ``json`` alone: building the SDK's pydantic objects took twice the CPU per
    token (measured 220-280 us vs ~110 us), and that bounds how many streams a worker can hold.
    """
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data, object_hook=_Fields)
        if chunk.get("error"):
            raise errors.ServerError(f"{endpoint}: error in the stream: {chunk['error']}"[:400])
        yield chunk


class _Accumulator:
    """Collects a stream's deltas into one turn."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.finish_reason: str | None = None
        self.usage = Usage()
        self.text_chunks = 0

    def add(self, chunk: Any) -> None:
        if chunk.usage is not None:
            self.usage = Usage(
                prompt_tokens=chunk.usage.prompt_tokens or 0,
                completion_tokens=chunk.usage.completion_tokens or 0,
            )
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is not None:
                self.content.append(delta.content or "")
                piece = delta_reasoning(delta)
                if piece:
                    self.reasoning.append(piece)
                self.text_chunks += bool(delta.content or piece)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def result(self, latency: float, endpoint: str, model: str) -> TurnResult:
        if self.finish_reason is None:
            raise errors.Disconnected(f"{endpoint}: stream ended without a finish_reason")
        reasoning, content = finish_text("".join(self.content), "".join(self.reasoning) or None)
        if not content.strip() and not reasoning and self.finish_reason != "length":
            raise errors.EmptyResponse(f"{endpoint}: the model returned an empty answer")
        return TurnResult(
            content=content, reasoning=reasoning, finish_reason=self.finish_reason,
            usage=self.usage, latency_s=round(latency, 3), endpoint=endpoint, model=model,
        )  # fmt: skip
