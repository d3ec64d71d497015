"""OpenAI-compatible HTTP server standing in for vLLM on machines without a GPU (not a model).

The answers come from `simulator.answers` (pure) and the faults from `simulator.faults` (pure);
this module only adds what needs a network and a clock: admission, pacing, SSE framing, fault
delivery, metrics and the generation log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import socket
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import prometheus_client as prom
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from simulator.answers import SimAnswer, count_prompt_tokens, expected_answer, inline_tokens
from simulator.answers import prompt_key as make_prompt_key
from simulator.config import ReasoningField, SimConfig
from simulator.faults import (
    MID_STREAM_FAULTS,
    Fault,
    FaultPlan,
    context_error,
    cut_point,
    request_rng,
)

Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]
EndEvent = Literal["completed", "aborted", "stalled", "disconnected"]

# With time_per_token == 0 tokens go out in chunks of this size, to keep the simulator fast.
FAST_CHUNK_TOKENS = 16
OWNER = "eaglegen-simulator"


class SimulatedDisconnect(Exception):
    """Raised inside a response so that uvicorn drops the connection mid-answer."""


# ---------------------------------------------------------------------------------------------
# Admission: vLLM's running batch and FIFO waiting queue.


class Slots:
    """FIFO admission of at most `capacity` concurrent sequences; capacity may change live."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.peak = 0
        self._queue: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Number of requests queued for a slot."""
        return len(self._queue)

    async def acquire(self) -> None:
        """Wait (FIFO) until a slot is free, then take it."""
        if not self._queue and self.running < self.capacity:
            self._take()
            return
        ticket = asyncio.get_running_loop().create_future()
        self._queue.append(ticket)
        try:
            await ticket
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    def release(self) -> None:
        """Give a slot back and admit the next waiters that now fit."""
        self.running -= 1
        self._admit()

    def resize(self, capacity: int) -> None:
        """Change capacity; running sequences keep their slots when it shrinks."""
        self.capacity = capacity
        self._admit()

    def _take(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)

    def _admit(self) -> None:
        while self._queue and self.running < self.capacity:
            ticket = self._queue.popleft()
            if not ticket.done():  # a cancelled waiter may still sit in the queue
                ticket.set_result(None)
                self._take()

    def _abandon(self, ticket: asyncio.Future[None]) -> None:
        if ticket in self._queue:
            self._queue.remove(ticket)
        elif ticket.done() and not ticket.cancelled():
            # The slot was granted just as the waiter was cancelled: hand it on.
            self.release()


# ---------------------------------------------------------------------------------------------
# Bookkeeping: stats, Prometheus metrics, JSONL generation log.


@dataclass
class Stats:
    """Counters behind GET /sim/stats."""

    requests: int = 0
    completed: int = 0
    aborted: int = 0
    rejected: int = 0
    tokens_generated: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    generations_by_key: Counter[str] = field(default_factory=Counter)


class Metrics:
    """vLLM-named Prometheus metrics in a registry owned by one app."""

    def __init__(self, model_name: str, slots: Slots) -> None:
        self.registry = prom.CollectorRegistry()
        self._labels = {"model_name": model_name}
        self._gauge("vllm:num_requests_running", "Sequences running.", lambda: slots.running)
        self._gauge("vllm:num_requests_waiting", "Requests waiting.", lambda: slots.waiting)

        def usage() -> float:
            # Each sequence is assumed to fill an equal share of the KV cache.
            return min(1.0, slots.running / slots.capacity)

        self._gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).", usage)
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = self._counter("vllm:generation_tokens", "Tokens generated.")
        self._success = prom.Counter(
            "vllm:request_success",
            "Finished requests.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )

    def success(self, finish_reason: str) -> None:
        """Count one successfully finished request."""
        self._success.labels(finished_reason=finish_reason, **self._labels).inc()

    def exposition(self) -> bytes:
        """Return the Prometheus text exposition."""
        return prom.generate_latest(self.registry)

    def _gauge(self, name: str, doc: str, value: Callable[[], float]) -> None:
        gauge = prom.Gauge(name, doc, ["model_name"], registry=self.registry)
        gauge.labels(**self._labels).set_function(value)

    def _counter(self, name: str, doc: str) -> prom.Counter:
        counter = prom.Counter(name, doc, ["model_name"], registry=self.registry)
        return counter.labels(**self._labels)


class GenerationLog:
    """Append-only JSONL log of generation ends, flushed per line so it survives kills."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line (no-op without a path)."""
        if self.path is None:
            return
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file if it was opened."""
        if self._file is not None:
            self._file.close()
            self._file = None


# ---------------------------------------------------------------------------------------------
# Request model and per-request job.


class StreamOptions(BaseModel):
    """OpenAI `stream_options`."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The part of an OpenAI chat-completion request the simulator looks at."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None  # accepted and ignored: answers are deterministic
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for m in messages:
            if not isinstance(m.get("role"), str) or "content" not in m:
                raise ValueError("every message needs a string 'role' and a 'content'")
        return messages

    @property
    def limit(self) -> int | None:
        """max_completion_tokens wins over the deprecated max_tokens, as in vLLM."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def thinking(self) -> bool:
        """chat_template_kwargs.enable_thinking, default on."""
        return bool((self.chat_template_kwargs or {}).get("enable_thinking", True))

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ConfigUpdate(BaseModel):
    """Body of POST /sim/config: the knobs that may change at runtime."""

    model_config = ConfigDict(extra="forbid")
    max_num_seqs: int | None = Field(default=None, ge=1)
    time_per_token: float | None = Field(default=None, ge=0.0)
    ttft: float | None = Field(default=None, ge=0.0)


@dataclass(frozen=True)
class Job:
    """One admitted chat completion: what to send and how it ends."""

    request_id: str
    created: int
    model: str
    key: str
    prompt_tokens: int
    answer: SimAnswer
    reasoning_field: ReasoningField
    pieces: list[Piece]
    fault: Fault
    cut: int
    include_usage: bool


def answer_pieces(answer: SimAnswer, reasoning_field: ReasoningField) -> list[Piece]:
    """Return the tokens in emission order, each tagged with the delta field it goes to."""
    if reasoning_field == "inline":
        return [("content", t) for t in inline_tokens(answer)]
    return [("reasoning", t) for t in answer.reasoning_tokens] + [
        ("content", t) for t in answer.content_tokens
    ]


def batch_pieces(pieces: list[Piece], size: int) -> list[list[Piece]]:
    """Group consecutive pieces of the same kind into batches of at most `size`."""
    batches: list[list[Piece]] = []
    for piece in pieces:
        last = batches[-1] if batches else None
        if last is not None and len(last) < size and last[0][0] == piece[0]:
            last.append(piece)
        else:
            batches.append([piece])
    return batches


# ---------------------------------------------------------------------------------------------
# Response bodies (pure): OpenAI / vLLM JSON objects.


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    """Return a vLLM-style error object."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def usage_body(job: Job) -> dict[str, int]:
    """Return the usage object of a finished job."""
    done = job.answer.completion_tokens
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": done,
        "total_tokens": job.prompt_tokens + done,
    }


def chunk_body(job: Job, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """Return one chat.completion.chunk with a single choice."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {**_envelope(job, "chat.completion.chunk"), "choices": [choice]}


def usage_chunk_body(job: Job) -> dict[str, Any]:
    """Return the trailing usage chunk (no choices) sent when include_usage is set."""
    return {**_envelope(job, "chat.completion.chunk"), "choices": [], "usage": usage_body(job)}


def delta_body(batch: list[Piece], reasoning_field: ReasoningField) -> dict[str, str]:
    """Return the delta carrying one same-kind batch of tokens."""
    kind = batch[0][0]
    name = "content" if kind == "content" else reasoning_field
    return {name: "".join(text for _, text in batch)}


def completion_body(job: Job) -> dict[str, Any]:
    """Return the non-streaming chat.completion object of a finished job."""
    choice = {
        "index": 0,
        "message": message_body(job.answer, job.reasoning_field),
        "logprobs": None,
        "finish_reason": job.answer.finish_reason,
    }
    return {**_envelope(job, "chat.completion"), "choices": [choice], "usage": usage_body(job)}


def message_body(answer: SimAnswer, reasoning_field: ReasoningField) -> dict[str, Any]:
    """Return the assistant message; empty texts are null, as vLLM sends them."""
    if reasoning_field == "inline":
        return {"role": "assistant", "content": "".join(inline_tokens(answer)) or None}
    return {
        "role": "assistant",
        "content": answer.content or None,
        reasoning_field: answer.reasoning or None,
    }


def _envelope(job: Job, obj: str) -> dict[str, Any]:
    return {"id": job.request_id, "object": obj, "created": job.created, "model": job.model}


def _sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


# ---------------------------------------------------------------------------------------------
# Server state.


class SimState:
    """Everything one simulator app owns: config, admission, stats, metrics and log."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.plan = FaultPlan.from_config(cfg)
        self.slots = Slots(cfg.max_num_seqs)
        self.stats = Stats()
        self.metrics = Metrics(cfg.model_name, self.slots)
        self.log = GenerationLog(cfg.log_path)
        self.attempts: Counter[str] = Counter()
        self.created = int(time.time())
        # Set when the server shuts down so stalled generations let go instead of blocking it.
        self.stopping = asyncio.Event()
        self._ids = itertools.count(1)

    def new_request_id(self, key: str) -> str:
        """Return a unique request id that also shows the prompt key."""
        return f"chatcmpl-{key}-{next(self._ids)}"

    def next_attempt(self, key: str) -> int:
        """Count one more attempt of prompt `key` and return its 1-based number."""
        self.attempts[key] += 1
        return self.attempts[key]

    def update(self, change: ConfigUpdate) -> None:
        """Apply a runtime config change (capacity and pacing)."""
        self.cfg = self.cfg.model_copy(update=change.model_dump(exclude_none=True))
        self.slots.resize(self.cfg.max_num_seqs)

    def on_start(self, job: Job) -> None:
        """Record that a generation got a slot."""
        self.metrics.prompt_tokens.inc(job.prompt_tokens)

    def on_tokens(self, n: int) -> None:
        """Record `n` generated tokens."""
        self.stats.tokens_generated += n
        self.metrics.generation_tokens.inc(n)

    def on_end(self, job: Job, event: EndEvent, sent: int) -> None:
        """Record the end of a generation in stats, metrics and the log."""
        finish = job.answer.finish_reason if event == "completed" else None
        if finish is not None:
            self.stats.completed += 1
            self.stats.generations_by_key[job.key] += 1
            self.metrics.success(finish)
        else:
            self.stats.aborted += 1
        self.log.write(
            {
                "ts": time.time(),
                "key": job.key,
                "event": event,
                "completion_tokens": sent,
                "finish_reason": finish,
            }
        )

    def stats_body(self) -> dict[str, Any]:
        """Return the JSON body of GET /sim/stats."""
        s = self.stats
        return {
            "requests": s.requests,
            "completed": s.completed,
            "aborted": s.aborted,
            "rejected": s.rejected,
            "faults": dict(s.faults),
            "running": self.slots.running,
            "waiting": self.slots.waiting,
            "peak_running": self.slots.peak,
            "generations_by_key": dict(s.generations_by_key),
            "tokens_generated": s.tokens_generated,
            "max_num_seqs": self.slots.capacity,
        }


# ---------------------------------------------------------------------------------------------
# Generation: slot, time to first token, paced tokens, then the planned ending.


async def generate(state: SimState, job: Job) -> AsyncGenerator[list[Piece]]:
    """Yield the job's token batches while holding a slot; always release it and log the end."""
    await state.slots.acquire()
    state.on_start(job)
    event: EndEvent = "aborted"  # what a cancellation (client gone) leaves in place
    sent = 0
    try:
        await _pause(state.cfg.ttft)
        pieces = job.pieces[: job.cut] if job.fault in MID_STREAM_FAULTS else job.pieces
        async for batch in _paced(pieces, state.cfg.time_per_token):
            sent += len(batch)
            state.on_tokens(len(batch))
            yield batch
        if job.fault is Fault.STALL:
            event = "stalled"
            await _stall(state)
            raise SimulatedDisconnect("stall over")
        if job.fault is Fault.DISCONNECT:
            event = "disconnected"
            raise SimulatedDisconnect("simulated disconnect")
        event = "completed"
    finally:
        state.slots.release()
        state.on_end(job, event, sent)


async def _paced(pieces: list[Piece], time_per_token: float) -> AsyncIterator[list[Piece]]:
    if time_per_token <= 0:
        for batch in batch_pieces(pieces, FAST_CHUNK_TOKENS):
            yield batch
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(pieces, start=1):
        # Sleep to an absolute schedule so per-sleep overhead does not accumulate.
        await asyncio.sleep(max(0.0, start + i * time_per_token - loop.time()))
        yield [piece]


async def _pause(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


async def _stall(state: SimState) -> None:
    # Ends on server shutdown too; a client disconnect cancels the whole task instead.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(state.stopping.wait(), state.cfg.stall_seconds)


# ---------------------------------------------------------------------------------------------
# ASGI delivery of a job.

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


class JobResponse(Response):
    """Runs one job's body and cancels it as soon as the client disconnects."""

    def __init__(self, body: Callable[[Send], Awaitable[None]]) -> None:
        super().__init__()
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Race the body against a client disconnect; re-raise a simulated disconnect."""
        work = asyncio.ensure_future(self._body(send))
        gone = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            work.cancel()
            gone.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
        if not work.cancelled():
            work.result()  # a SimulatedDisconnect propagates so uvicorn drops the connection


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _start(status: int, headers: Mapping[str, str]) -> dict[str, Any]:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": raw}


def _body(data: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def stream_job(state: SimState, job: Job, send: Send) -> None:
    """Send a job as server-sent events, as vLLM does for stream=true."""
    await send(_start(200, {**SSE_HEADERS, "x-sim-key": job.key}))
    opening = _sse(chunk_body(job, {"role": "assistant", "content": ""}))
    async with contextlib.aclosing(generate(state, job)) as batches:
        async for batch in batches:
            data = _sse(chunk_body(job, delta_body(batch, job.reasoning_field)))
            await send(_body(opening + data, more=True))
            opening = b""
    await send(_body(_stream_tail(job), more=False))


def _stream_tail(job: Job) -> bytes:
    tail = _sse(chunk_body(job, {}, job.answer.finish_reason))
    if job.include_usage:
        tail += _sse(usage_chunk_body(job))
    return tail + _sse("[DONE]")


async def respond_job(state: SimState, job: Job, send: Send) -> None:
    """Send a job as one chat.completion object, as vLLM does for stream=false."""
    headers = {"content-type": "application/json", "x-sim-key": job.key}
    try:
        async with contextlib.aclosing(generate(state, job)) as batches:
            async for _ in batches:
                pass
    except SimulatedDisconnect:
        # Start the response first, so dropping the connection is a broken response
        # rather than the clean 500 uvicorn would send for an unstarted one.
        await send(_start(200, headers))
        raise
    payload = json.dumps(completion_body(job), ensure_ascii=False).encode()
    await send(_start(200, {**headers, "content-length": str(len(payload))}))
    await send(_body(payload, more=False))


# ---------------------------------------------------------------------------------------------
# Endpoints.


def _state(request: Request) -> SimState:
    state: SimState = request.app.state.sim
    return state


def _error(
    status: int, message: str, err_type: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = error_body(status, message, err_type)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def health(request: Request) -> Response:
    """GET /health: 200 while the server is up."""
    return Response(status_code=200)


async def models(request: Request) -> Response:
    """GET /v1/models: the one served model."""
    state = _state(request)
    card = {
        "id": state.cfg.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": OWNER,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text with vLLM metric names."""
    return Response(_state(request).metrics.exposition(), media_type=prom.CONTENT_TYPE_LATEST)


async def sim_stats(request: Request) -> Response:
    """GET /sim/stats: simulator counters as JSON."""
    return JSONResponse(_state(request).stats_body())


async def sim_config(request: Request) -> Response:
    """POST /sim/config: change max_num_seqs / time_per_token / ttft at runtime."""
    state = _state(request)
    try:
        change = ConfigUpdate.model_validate_json(await request.body())
    except ValidationError as exc:
        return _error(400, _validation_message(exc), "BadRequestError")
    state.update(change)
    cfg = state.cfg
    return JSONResponse(cfg.model_dump(include={"max_num_seqs", "time_per_token", "ttft"}))


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions: validate, plan faults, then stream or answer."""
    state = _state(request)
    state.stats.requests += 1
    parsed = await _parse_chat(request)
    if isinstance(parsed, Response):
        state.stats.rejected += 1
        return parsed
    if parsed.model is not None and parsed.model != state.cfg.model_name:
        state.stats.rejected += 1
        msg = f"The model `{parsed.model}` does not exist."
        return JSONResponse(error_body(404, msg, "NotFoundError", "model"), status_code=404)
    return _admit(state, parsed)


async def _parse_chat(request: Request) -> ChatRequest | Response:
    try:
        return ChatRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        return _error(400, _validation_message(exc), "BadRequestError")


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())


def _admit(state: SimState, req: ChatRequest) -> Response:
    key = make_prompt_key(req.messages)
    prompt_tokens = count_prompt_tokens(req.messages)
    too_long = context_error(prompt_tokens, req.limit, state.cfg.max_model_len)
    if too_long is not None:
        # Rejected before generation, so it counts neither as an attempt nor a generation.
        state.stats.rejected += 1
        return _error(400, too_long, "BadRequestError", {"x-sim-key": key})
    attempt = state.next_attempt(key)
    rng = request_rng(state.cfg.seed, key, attempt)
    fault = state.plan.decide(key, attempt, rng)
    if fault is not Fault.NONE:
        state.stats.faults[fault.value] += 1
    early = _early_fault(fault, key)
    if early is not None:
        return early
    job = _build_job(state, req, key, prompt_tokens, fault, rng)
    body = stream_job if req.stream else respond_job
    return JobResponse(lambda send: body(state, job, send))


def _early_fault(fault: Fault, key: str) -> Response | None:
    if fault is Fault.HTTP_500:
        return _error(
            500, "Simulated internal server error.", "InternalServerError", {"x-sim-key": key}
        )
    if fault is Fault.HTTP_429:
        headers = {"x-sim-key": key, "retry-after": "1"}
        return _error(429, "Simulated rate limit.", "RateLimitError", headers)
    return None


def _build_job(
    state: SimState,
    req: ChatRequest,
    key: str,
    prompt_tokens: int,
    fault: Fault,
    rng: random.Random,
) -> Job:
    cfg = state.cfg
    answer = expected_answer(req.messages, req.limit, cfg, req.thinking)
    pieces = answer_pieces(answer, cfg.reasoning_field)
    cut = cut_point(len(pieces), rng) if fault in MID_STREAM_FAULTS else len(pieces)
    return Job(
        request_id=state.new_request_id(key),
        created=int(time.time()),
        model=cfg.model_name,
        key=key,
        prompt_tokens=prompt_tokens,
        answer=answer,
        reasoning_field=cfg.reasoning_field,
        pieces=pieces,
        fault=fault,
        cut=cut,
        include_usage=req.include_usage,
    )


# ---------------------------------------------------------------------------------------------
# App and server.


def create_app(cfg: SimConfig) -> Starlette:
    """Return the simulator ASGI app; its state lives in `app.state.sim`."""
    state = SimState(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        state.log.close()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
        Route("/sim/config", sim_config, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = state
    return app


class _HideSimulatedDisconnects(logging.Filter):
    """Keeps uvicorn from logging a traceback for every deliberately dropped connection."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedDisconnect)


_DISCONNECT_FILTER = _HideSimulatedDisconnects()


class SimServer(uvicorn.Server):
    """uvicorn server that releases stalled generations as soon as shutdown begins."""

    def __init__(self, config: uvicorn.Config, state: SimState) -> None:
        super().__init__(config)
        self.sim_state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Wake stalled generations first, then shut down as uvicorn does."""
        # uvicorn waits for open connections before the lifespan shutdown, so a stall
        # would otherwise hold the server up for stall_seconds.
        self.sim_state.stopping.set()
        await super().shutdown(sockets=sockets)


def create_server(cfg: SimConfig, host: str = "127.0.0.1", port: int = 8000) -> SimServer:
    """Return a configured (not started) uvicorn server for the simulator."""
    app = create_app(cfg)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    # Added after uvicorn.Config, which (re)configures logging.
    logging.getLogger("uvicorn.error").addFilter(_DISCONNECT_FILTER)
    return SimServer(config, app.state.sim)


def serve(cfg: SimConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the simulator until interrupted."""
    create_server(cfg, host, port).run()
