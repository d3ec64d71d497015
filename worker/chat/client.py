"""The one place that talks HTTP to an OpenAI-compatible server.

A thin client: the request body is one ``json.dumps``, the HTTP is :mod:`worker.chat.transport`
(keep-alive connections on ``http.client``) and the stream is read by one decoder
(:mod:`worker.chat.stream`), bytes in, the turn out: the openai SDK's request building and line
reader and httpx's HTTP layer each cost more per streamed token than this path does
(bench/bench_client.py compares them). Requests are streamed: the read timeout is
the stall timeout (no byte for N seconds), so a slow generation that keeps producing tokens is
never cut, while a dead stream is noticed. Transport errors and HTTP statuses are translated
here, once, into the EagleGen exception tree.

Token ids (vLLM's ``return_token_ids``) are asked for per ``Settings.token_ids``; whether an
endpoint gives them is learned from its first answers and remembered (:class:`IdSupport`).

A turn cut short continues from a :class:`~common.models.Checkpoint` (docs/resume.md):
exactly from its token ids on ``/v1/completions``, else from its text with
``continue_final_message``, and only where the server proves it continues (else the turn
starts again: an answer given afresh is never joined to the partial). While a turn streams,
a :class:`Progress` is offered checkpoints, and an error that breaks a stream carries the
checkpoint of what had arrived.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from common import errors
from common.logs import secrets_of
from common.models import Checkpoint, GenParams, TurnResult
from common.redact import redact
from common.settings import Settings
from worker.chat import transport

# Messages and the bodies are imported from here by the pool, the pipeline, benches and tests.
from worker.chat.bodies import Messages as Messages
from worker.chat.bodies import chat_body as chat_body
from worker.chat.bodies import completion_body as completion_body
from worker.chat.bodies import continue_body, encode
from worker.chat.request_ids import new_request_id
from worker.chat.stream import CompletionStream, TurnStream

Check = Callable[[], None]
MODELS_BODY = 1 << 20  # bytes: a /v1/models list longer than this is not one
# Refusals of /v1/completions in a row (none answered since) before exact resume is off for the
# endpoint: one refusal may be that request's own (a prompt too long), not the endpoint's.
COMPLETIONS_REFUSALS = 3


class Progress(Protocol):
    """Where a streaming turn's checkpoints go (the worker saves them under the sample's lease).

    ``due`` is asked after every network read, so it must be cheap; ``tokens`` is the turn's
    total so far, what it resumed from included (as ``Checkpoint.tokens``). ``started`` is told
    each request's own id on the server once its first chunk names it (to abort it later).
    """

    def due(self, tokens: int) -> bool: ...

    def save(self, checkpoint: Checkpoint) -> None: ...

    def started(self, endpoint: str, server_id: str) -> None: ...


# Whatever a hostile or broken answer makes the decoder raise: one BadResponse.
UNDECODABLE = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)


@contextmanager
def translate_errors(endpoint: str, secrets: Sequence[str] = ()) -> Iterator[None]:
    """Map transport exceptions and undecodable bodies to transient EagleGen errors.

    Messages are built from the server's text redacted and shortened, and the lower error is
    not chained (``from None``): Celery's events, tracebacks and Flower show only this one.
    """
    try:
        yield
    except errors.EagleGenError:
        raise
    except transport.ConnectTimeout:
        raise errors.TimeoutError_(f"{endpoint}: timed out connecting") from None
    except transport.DeadlineExceeded:
        raise errors.TimeoutError_(f"{endpoint}: the request exceeded its time limit") from None
    except transport.ReadTimeout:
        stalled = f"{endpoint}: stream stalled (no data within the timeout)"
        raise errors.StallError(stalled) from None
    except transport.Dropped as exc:
        text = server_text(str(exc), secrets)
        raise errors.Disconnected(f"{endpoint}: connection dropped mid-response: {text}") from None
    except transport.ConnectFailed as exc:
        text = server_text(str(exc), secrets)
        raise errors.ConnectError(f"{endpoint}: cannot connect: {text}") from None
    except UNDECODABLE as exc:  # a body that is not OpenAI JSON, or JSON of the wrong shape
        text = server_text(f"{type(exc).__name__}: {exc}", secrets)
        raise errors.BadResponse(f"{endpoint}: response is not OpenAI JSON: {text}") from None


def server_text(text: str, secrets: Sequence[str], limit: int = 300) -> str:
    """A server's text as it may appear in an error: secrets masked, one short line."""
    return " ".join(redact(text[: limit * 4], list(secrets)).split())[:limit]


def status_error(
    status: int, body: bytes, endpoint: str, secrets: Sequence[str] = ()
) -> errors.GenerationError:
    """The EagleGen error of an HTTP error status, with the server's message."""
    text = f"{endpoint}: HTTP {status}: {server_text(_error_message(body), secrets)}"
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
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")
    error = found.get("error", found) if isinstance(found, dict) else found
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


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

    def answered(self, turn: TurnResult, learn: bool = True) -> None:
        """Learn from a finished chat turn (``learn``: not from a continuation, which asks
        another API, nor from a turn whose ids were dropped as inconsistent); in ``on`` mode
        a turn without ids fails."""
        has_ids = turn.prompt_token_ids is not None
        if self.known is None and learn and turn.token_ids_dropped is None:
            self.known = has_ids
        if self.mode == "on" and not has_ids:
            why = turn.token_ids_dropped
            exc = self._missing(f"gave ids that {why}" if why else "answered without token ids")
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
        self._secrets = secrets_of(settings)
        self._chat_url = f"{endpoint}/chat/completions"
        self._completions_url = f"{endpoint}/completions"
        # Whether the endpoint continues token-id prompts on /v1/completions, and whether it
        # honours continue_final_message (None: not tried yet).
        self.completions: bool | None = None
        self._refusals = 0  # of /v1/completions in a row
        self.chat_continues: bool | None = None
        self._probe_lock = threading.Lock()
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

    def probe(self, timeout: float | None = None) -> None:
        """One cheap request (GET /models) that raises the EagleGen error if the server is down."""
        self._models(timeout)

    def _models(self, timeout: float | None = None) -> list[dict[str, Any]]:
        with translate_errors(self.endpoint, self._secrets):
            url, limit = self._models_url, timeout or self._settings.probe_timeout
            status, content = self._http.get(url, limit, MODELS_BODY)
            if status != 200:
                raise status_error(status, content, self.endpoint, self._secrets)
            found = json.loads(content)
            data = found.get("data") if isinstance(found, dict) else None
            if not isinstance(data, list):
                raise errors.BadResponse(f"{self.endpoint}: /v1/models holds no model list")
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    def complete(
        self,
        messages: Messages,
        params: GenParams,
        check: Check | None = None,
        *,
        turn: int = 0,
        resume: Checkpoint | None = None,
        progress: Progress | None = None,
        fields: dict[str, Any] | None = None,
    ) -> TurnResult:
        """Generate assistant turn ``turn``, or continue it from ``resume``.

        ``check`` runs per network read and may raise to abort; ``progress`` is offered a
        checkpoint when it says one is due. An error that breaks the stream carries the
        checkpoint of what had arrived (``exc.checkpoint``). ``fields``: what the sample adds
        to every request (its ``tools`` and ``tool_choice``).
        """
        model = self.model()
        if resume is not None and self._resumable(resume, model):
            resumed = self._continue(messages, params, check, progress, resume, model)
            if resumed is not None:
                return resumed
        # The checkpoint could not be continued: its tokens are generated again, counted with
        # those of the turn's earlier attempts set aside.
        discarded = resume.discarded_tokens + resume.tokens if resume is not None else 0
        result = self._fresh(messages, params, check, turn, progress, model, fields, discarded)
        if resume is not None and resume.tokens > 0:  # (its stream carries discarded_tokens)
            result.discarded_from = resume.endpoint
        return result

    def _fresh(
        self, messages: Messages, params: GenParams, check: Check | None, turn: int,
        progress: Progress | None, model: str, fields: dict[str, Any] | None = None,
        discarded: int = 0,
    ) -> TurnResult:  # fmt: skip
        """The turn generated from its start on the chat API (``discarded``: tokens of its
        earlier attempts set aside, carried in its checkpoints)."""
        ask = self.ids.ask()
        body = chat_body(model, messages, params, ask, fields)
        stream = TurnStream(self.endpoint, model, turn, discarded=discarded)
        try:
            result = self._turn(self._chat_url, body, stream, check, progress)
        except errors.BadRequest as exc:
            if not (ask and self.ids.refused(exc)):
                raise
            body = chat_body(model, messages, params, False, fields)
            stream = TurnStream(self.endpoint, model, turn, discarded=discarded)
            result = self._turn(self._chat_url, body, stream, check, progress)
        self.ids.answered(result)
        return result

    def continues(self) -> bool | None:
        """Whether this endpoint continues a checkpoint: proven (a token-id continuation it
        echoed exactly, or the chat probe), known not to (both tried), or None: not learned."""
        if self.completions or self.chat_continues:
            return True
        no_ids = self.completions is False or self.ids.mode == "off"
        return False if no_ids and self.chat_continues is False else None

    def _resumable(self, resume: Checkpoint, model: str) -> bool:
        """Whether to continue from ``resume``: resume on, tokens to continue, the same model
        (another model's tokens are no prefix of this one's answer)."""
        if resume.tokens <= 0 or self._settings.resume != "auto":
            return False
        return not resume.model or resume.model == model

    def _continue(
        self,
        messages: Messages,
        params: GenParams,
        check: Check | None,
        progress: Progress | None,
        resume: Checkpoint,
        model: str,
    ) -> TurnResult | None:
        """The turn continued from its checkpoint; None: start it again (ids required, none)."""
        left = params.max_tokens - resume.tokens
        if left <= 0:  # it had already used up max_tokens: nothing to ask for
            return TurnStream(self.endpoint, model, resume.turn, resume).finished()
        with_ids = resume.prompt_token_ids is not None and resume.token_ids is not None
        if with_ids and self.completions is not False:
            exact = self._continue_ids(params, check, progress, resume, model, left)
            if exact is not None:
                return exact
        if self.ids.mode == "on":
            return None  # a text continuation has no ids; the turn starts again, with them
        if not self._continues_chat(model):
            return None  # not proven to honour continue_final_message: start again
        body = continue_body(model, messages, params, resume, left)
        stream = TurnStream(self.endpoint, model, resume.turn, resume)
        return self._turn(self._chat_url, body, stream, check, progress)

    def _continues_chat(self, model: str) -> bool:
        """Whether this endpoint honours ``continue_final_message``, probed once and remembered.

        A server that ignores it (or a proxy that drops the field) closes the partial message
        and answers afresh; joined to the partial, that answer would corrupt the record
        silently. Two one-token probes tell: continuing "A" and then "A B", the first prompt
        the server echoes must be a prefix of the second (an ignored continuation ends it with
        an end of turn and a generation prompt). A server that echoes no prompt ids cannot
        prove it, so its turns start again.
        """
        with self._probe_lock:
            if self.chat_continues is None:
                # A probe broken by the network decides nothing: not remembered.
                found = self._probe_continuation(model)
                self.chat_continues = found
                return bool(found)
            return self.chat_continues

    def _probe_continuation(self, model: str) -> bool | None:
        try:
            short = self._echoed_prompt(model, "The sky over the sea is")
            longer = self._echoed_prompt(model, "The sky over the sea is blue and calm")
        except errors.TransientError:
            return None
        except errors.GenerationError:
            return False  # refused (400, 404...): no continuation here
        if short is None or longer is None or len(longer) <= len(short):
            return False
        # The last token of the shorter partial may merge with what follows it.
        return longer[: len(short) - 1] == short[:-1]

    def _echoed_prompt(self, model: str, partial: str) -> list[int] | None:
        """The prompt ids the server echoes for continuing ``partial`` (one try again after a
        transient error: the probe is two tiny requests)."""
        try:
            return self._echo_once(model, partial)
        except errors.TransientError:
            return self._echo_once(model, partial)

    def _echo_once(self, model: str, partial: str) -> list[int] | None:
        messages = [
            {"role": "user", "content": "Finish the sentence."},
            {"role": "assistant", "content": partial},
        ]
        body: dict[str, Any] = {
            "model": model, "messages": messages, "max_tokens": 1, "stream": True,
            "continue_final_message": True, "add_generation_prompt": False,
            "return_token_ids": True,
        }  # fmt: skip
        stream = TurnStream(self.endpoint, model)
        self._read(self._chat_url, encode(body), stream, None, None, self._settings.probe_timeout)
        return stream.prompt_token_ids

    def _continue_ids(
        self,
        params: GenParams,
        check: Check | None,
        progress: Progress | None,
        resume: Checkpoint,
        model: str,
        left: int,
    ) -> TurnResult | None:
        """The exact continuation on /v1/completions; None if the endpoint refuses it."""
        assert resume.prompt_token_ids is not None and resume.token_ids is not None
        prompt = resume.prompt_token_ids + resume.token_ids
        stream = CompletionStream(self.endpoint, model, resume.turn, resume, prompt)
        try:
            result = self._turn(
                self._completions_url, completion_body(model, prompt, params, left), stream,
                check, progress,
            )  # fmt: skip
        except errors.NotContinued:
            # It answered a token-id prompt afresh: proven not to continue; remembered, and
            # continued from the text instead, if that is proven to work there.
            self.completions = False
            return None
        except (errors.BadRequest, errors.NotFound):
            # No /v1/completions, or no token-id prompts (SGLang, hosted APIs): the same,
            # remembered after a few refusals in a row (one may be that request's own).
            self._refusals += 1
            if self._refusals >= COMPLETIONS_REFUSALS:
                self.completions = False
            return None
        self.completions, self._refusals = True, 0
        self.ids.answered(result, learn=False)
        return result

    def _turn(
        self, url: str, body: bytes, stream: TurnStream, check: Check | None,
        progress: Progress | None,
    ) -> TurnResult:  # fmt: skip
        started = time.monotonic()
        try:
            self._read(url, body, stream, check, progress)
            with translate_errors(self.endpoint, self._secrets):
                return stream.result(time.monotonic() - started, stream.model)
        except errors.GenerationError as exc:
            # Server text may have reached the message anywhere below: masked before it leaves.
            exc.args = (server_text(str(exc), self._secrets, 1000),)
            exc.endpoint = exc.endpoint or self.endpoint
            exc.tokens_streamed = stream.tokens()
            # An answer of the wrong shape is no partial to continue from: continuing it would
            # cost requests (and probes) on a server that answers wrongly; it starts again.
            if not isinstance(exc, errors.BadResponse):
                exc.checkpoint = _checkpoint(stream)
            raise

    def _read(
        self, url: str, body: bytes, stream: TurnStream, check: Check | None,
        progress: Progress | None, seconds: float | None = None,
    ) -> None:  # fmt: skip
        """POST ``body`` and feed the streamed response to ``stream``, to its end, past [DONE]:
        a response left unread closes its connection, and every request would pay a new one
        (the server too). All of it within ``seconds`` (default ``max_request_time``); a
        finished stream's body gets ``drain_timeout`` to end, and one that does not keeps the
        turn. An error status's body gives the message, its first few KB within
        ``probe_timeout``."""
        deadline = time.monotonic() + (seconds or self._settings.max_request_time)
        stream.max_event = self._settings.max_event_bytes
        # The server builds its own request id from ours (vLLM: chatcmpl-<X-Request-Id>).
        headers = {"X-Request-Id": new_request_id()}
        with (
            translate_errors(self.endpoint, self._secrets),
            self._http.stream(
                "POST", url, content=body, deadline=deadline, check=check, headers=headers
            ) as response,
        ):
            if response.status_code != 200:
                response.limit(self._settings.probe_timeout)
                head = response.head_of(transport.ERROR_BODY)
                raise status_error(response.status_code, head, self.endpoint, self._secrets)
            self._feed(response, stream, check, progress)

    def _feed(
        self, response: transport.Response, stream: TurnStream, check: Check | None,
        progress: Progress | None,
    ) -> None:  # fmt: skip
        draining = False
        unnamed = progress is not None  # the request's server id not yet handed to progress
        try:
            for data in response.iter_raw():
                stream.feed(data)
                if unnamed and stream.server_id and progress is not None:
                    unnamed = False
                    progress.started(self.endpoint, stream.server_id)
                if check is not None:
                    check()
                if progress is not None and progress.due(stream.resumed + stream.tokens()):
                    saved = stream.checkpoint()
                    if saved is not None:
                        progress.save(saved)
                if stream.done and not draining:
                    draining = True
                    response.limit(self._settings.drain_timeout)
        except transport.TransportError:
            if not (draining and stream.finish_reason is not None):
                raise

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


def _checkpoint(stream: TurnStream) -> Checkpoint | None:
    """What a broken stream had generated; None when even that does not decode."""
    try:
        return stream.checkpoint()
    except (*UNDECODABLE, errors.EagleGenError):
        return None
