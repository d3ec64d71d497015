"""The HTTP handlers: vLLM's routes, plus /sim/stats and /sim/config to observe and steer."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping

import prometheus_client as prom
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from simulator.answers import count_prompt_tokens, expected_answer
from simulator.answers import prompt_key as make_prompt_key
from simulator.bodies import error_body
from simulator.delivery import JobResponse, respond_job, stream_job
from simulator.faults import MID_STREAM_FAULTS, Fault, context_error, cut_point, request_rng
from simulator.jobs import ChatRequest, ConfigUpdate, Job, answer_pieces
from simulator.state import SimState

OWNER = "eaglegen-simulator"


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
