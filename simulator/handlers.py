"""The HTTP handlers: vLLM's routes, plus /sim/stats and /sim/config to observe and steer."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Mapping
from typing import TypeVar

import prometheus_client as prom
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from simulator import hidden_states
from simulator.bodies import error_body
from simulator.delivery import JobResponse, respond_job, stream_job
from simulator.faults import MID_STREAM_FAULTS, Fault, request_rng
from simulator.jobs import (
    AbortRequest,
    ChatRequest,
    CompletionRequest,
    ConfigUpdate,
    Endpoint,
    Job,
)
from simulator.plans import Plan, Rejection, chat_plan, completion_plan
from simulator.sampling import sampled
from simulator.state import SimState

R = TypeVar("R", ChatRequest, CompletionRequest)
RUNTIME_KNOBS = {"max_num_seqs", "time_per_token", "ttft", "prefill_time_per_token"}

OWNER = "eaglegen-simulator"


def _state(request: Request) -> SimState:
    state: SimState = request.app.state.sim
    return state


def _error(
    status: int, message: str, err_type: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    # vLLM names the parameter at fault in the message and in ``param`` alike.
    named = re.search(r"\(parameter=(\w+), value=", message)
    body = error_body(status, message, err_type, named.group(1) if named else None)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def health(request: Request) -> Response:
    """GET /health: 200 while the server is up."""
    return Response(status_code=200)


async def models(request: Request) -> Response:
    """GET /v1/models: the one served model."""
    state = _state(request)
    name, created = state.cfg.model_name, state.created
    card = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNER,
        "root": name,  # vLLM: the model's path or name
        "parent": None,
        "max_model_len": state.cfg.max_model_len,  # as vLLM lists it
        "permission": [_permission(created)],
    }
    return JSONResponse({"object": "list", "data": [card]})


def _permission(created: int) -> dict[str, object]:
    """vLLM's (OpenAI's former) model permission entry, as vLLM lists it."""
    return {
        "id": f"modelperm-{created:x}", "object": "model_permission", "created": created,
        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
        "organization": "*", "group": None, "is_blocking": False,
    }  # fmt: skip


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text with vLLM metric names."""
    return Response(_state(request).metrics.exposition(), media_type=prom.CONTENT_TYPE_LATEST)


async def sim_stats(request: Request) -> Response:
    """GET /sim/stats: simulator counters as JSON."""
    return JSONResponse(_state(request).stats_body())


async def sim_config(request: Request) -> Response:
    """POST /sim/config: change capacity and pacing (RUNTIME_KNOBS) at runtime."""
    state = _state(request)
    try:
        change = ConfigUpdate.model_validate_json(await request.body())
    except ValidationError as exc:
        return _error(400, _validation_message(exc), "BadRequestError")
    state.update(change)
    cfg = state.cfg
    return JSONResponse(cfg.model_dump(include=RUNTIME_KNOBS))


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions: validate, plan faults, then stream or answer."""
    state = _state(request)
    parsed = await _read(request, state, ChatRequest)
    if isinstance(parsed, Response):
        return parsed
    with sampled(state.cfg.vary_answers, parsed.temperature, state.stats.requests):
        plan = chat_plan(parsed, state.cfg)
    given = request.headers.get("x-request-id")
    return _admit(state, plan, "chat", parsed.stream, parsed.include_usage, given)


async def completions(request: Request) -> Response:
    """POST /v1/completions: a text or token-id prompt, continued exactly."""
    state = _state(request)
    parsed = await _read(request, state, CompletionRequest)
    if isinstance(parsed, Response):
        return parsed
    if _extraction(state, parsed):
        return await _hidden_states(state, parsed)
    plan = completion_plan(parsed, state.cfg)
    given = request.headers.get("x-request-id")
    return _admit(state, plan, "completion", parsed.stream, parsed.include_usage, given)


def _extraction(state: SimState, parsed: CompletionRequest) -> bool:
    """A request vLLM's extract_hidden_states server answers with a file: token ids, one
    token (with a model configured)."""
    prompt = parsed.prompt
    is_ids = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
    return state.hidden is not None and is_ids and parsed.max_tokens == 1


async def _hidden_states(state: SimState, parsed: CompletionRequest) -> Response:
    assert state.hidden is not None
    ids = [int(i) for i in parsed.prompt]  # type: ignore[arg-type]  # checked: token ids
    state.stats.hidden_states += 1
    path, echo = await asyncio.to_thread(state.hidden.extract, ids)
    job_id = state.new_request_id("hs", "cmpl")
    body = hidden_states.answer(
        job_id, int(time.time()), state.cfg.model_name, ids, path, echo,
        bool(parsed.return_token_ids),
    )  # fmt: skip
    return JSONResponse(body)


async def abort_requests(request: Request) -> Response:
    """POST /inference/v1/abort_requests: stop the named generations (vLLM's, served there
    only with --enable-scale-out: 403 here under --no-abort-requests)."""
    state = _state(request)
    if not state.cfg.abort_requests:
        return _error(403, "Scale-out endpoints are disabled (--enable-scale-out).",
                      "ForbiddenError")  # fmt: skip
    try:
        ids = AbortRequest.model_validate_json(await request.body()).request_ids
    except ValidationError as exc:
        return _error(400, _validation_message(exc), "BadRequestError")
    return JSONResponse({"aborted": state.abort(ids)})


async def _read(request: Request, state: SimState, model: type[R]) -> R | Response:
    """Count the request; return it parsed, or the error response that refuses it."""
    state.stats.requests += 1
    try:
        parsed = model.model_validate_json(await request.body())
    except ValidationError as exc:
        state.stats.rejected += 1
        return _error(400, _validation_message(exc), "BadRequestError")
    if parsed.model is not None and parsed.model != state.cfg.model_name:
        state.stats.rejected += 1
        msg = f"The model `{parsed.model}` does not exist."
        return JSONResponse(error_body(404, msg, "NotFoundError", "model"), status_code=404)
    return parsed


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())


def _admit(
    state: SimState, plan: Plan | Rejection, endpoint: Endpoint, stream: bool, usage: bool,
    given_id: str | None = None,
) -> Response:  # fmt: skip
    if isinstance(plan, Rejection):
        # Rejected before generation, so it counts neither as an attempt nor a generation.
        state.stats.rejected += 1
        headers = {"x-sim-key": plan.key} if plan.key else {}
        return _error(400, plan.message, "BadRequestError", headers)
    key = plan.key
    attempt = state.next_attempt(key)
    rng = request_rng(state.cfg.seed, key, attempt)
    fault = state.plan.decide(key, attempt, rng)
    if fault is not Fault.NONE:
        state.stats.faults[fault.value] += 1
    early = _early_fault(fault, key)
    if early is not None:
        return early
    job = _build_job(state, plan, endpoint, usage, fault, rng, given_id)
    body = stream_job if stream else respond_job
    return JobResponse(lambda send: body(state, job, send), state.running, job.request_id, job.stop)


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
    plan: Plan,
    endpoint: Endpoint,
    include_usage: bool,
    fault: Fault,
    rng: random.Random,
    given_id: str | None = None,
) -> Job:
    cfg = state.cfg
    n = len(plan.output.pieces)
    return Job(
        request_id=state.new_request_id(
            plan.key, "cmpl" if endpoint == "completion" else "chatcmpl", given_id
        ),
        created=int(time.time()),
        model=cfg.model_name,
        key=plan.key,
        endpoint=endpoint,
        prompt_tokens=plan.prompt_tokens,
        prompt_ids=plan.prompt_ids,
        return_ids=plan.return_ids,
        output=plan.output,
        reasoning_field=cfg.reasoning_field,
        fault=fault,
        cut=state.plan.cut(n, rng) if fault in MID_STREAM_FAULTS else n,
        include_usage=include_usage,
    )
