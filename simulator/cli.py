"""`simulate` command: run the vLLM simulator (a stand-in for vLLM, not a model)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from simulator.config import SimConfig

HELP = (
    "Run the simulator: an OpenAI-compatible HTTP server that stands in for vLLM on machines "
    "without a GPU. It is NOT a model: answers are deterministic filler text derived from a "
    "hash of the prompt (the first content token is '[<prompt key>]'), with configurable "
    "capacity, pacing and injected faults. Like vLLM it returns token ids on request "
    "(return_token_ids; its own small tokenizer), continues token-id prompts on "
    "/v1/completions exactly, and keeps a prefix cache (vllm:prefix_cache_* metrics)."
)


class ReasoningFieldChoice(enum.StrEnum):
    """Where reasoning text goes in responses."""

    reasoning = "reasoning"
    reasoning_content = "reasoning_content"
    inline = "inline"


class OverContextChoice(enum.StrEnum):
    """What a request whose prompt + max_tokens is over the context window gets."""

    refuse = "refuse"
    clamp = "clamp"


# Single source of truth for the option defaults: the SimConfig model.
_DEFAULTS = SimConfig()
_REASONING_DEFAULT = ReasoningFieldChoice(_DEFAULTS.reasoning_field)
_OVER_CONTEXT_DEFAULT = OverContextChoice(_DEFAULTS.over_context)

Opt = typer.Option


def simulate(
    host: Annotated[str, Opt(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, Opt(help="TCP port to listen on.")] = 8000,
    model_name: Annotated[str, Opt(help="Served model id.")] = _DEFAULTS.model_name,
    time_per_token: Annotated[
        float, Opt(help="Seconds per token (0: as fast as possible).")
    ] = _DEFAULTS.time_per_token,
    fast_chunk_tokens: Annotated[
        int, Opt(help="Tokens per streamed chunk at --time-per-token 0 (1: like vLLM).")
    ] = _DEFAULTS.fast_chunk_tokens,
    ttft: Annotated[
        float, Opt(help="Seconds to first token once a slot is free.")
    ] = _DEFAULTS.ttft,
    max_num_seqs: Annotated[
        int, Opt(help="Concurrent sequences; further requests wait FIFO.")
    ] = _DEFAULTS.max_num_seqs,
    max_model_len: Annotated[
        int, Opt(help="Context window: prompt + completion tokens.")
    ] = _DEFAULTS.max_model_len,
    over_context: Annotated[
        OverContextChoice,
        Opt(help="prompt + max_tokens over the window: refuse (400) or clamp (vLLM 0.32)."),
    ] = _OVER_CONTEXT_DEFAULT,
    min_answer_tokens: Annotated[
        int, Opt(help="Shortest answer content, in tokens.")
    ] = _DEFAULTS.min_answer_tokens,
    max_answer_tokens: Annotated[
        int, Opt(help="Longest answer content, in tokens.")
    ] = _DEFAULTS.max_answer_tokens,
    long_answer_share: Annotated[
        float, Opt(help="Share of answers in a long tail (of --long-answer-tokens).")
    ] = _DEFAULTS.long_answer_share,
    long_answer_tokens: Annotated[
        int, Opt(help="Content tokens of the long tail's answers.")
    ] = _DEFAULTS.long_answer_tokens,
    reasoning_tokens: Annotated[
        int, Opt(help="Upper bound of reasoning length (0: no reasoning).")
    ] = _DEFAULTS.reasoning_tokens,
    reasoning_field: Annotated[
        ReasoningFieldChoice, Opt(help="Where reasoning goes (inline: <think> tags in content).")
    ] = _REASONING_DEFAULT,
    token_ids: Annotated[
        bool,
        Opt(
            "--token-ids/--no-token-ids",
            help="Serve vLLM's token-id extension (return_token_ids, token-id prompts); "
            "--no-token-ids behaves like a server without it.",
        ),
    ] = _DEFAULTS.token_ids,
    ignore_continuations: Annotated[
        bool,
        Opt(
            "--ignore-continuations",
            help="Answer continuation requests (continue_final_message, a token-id prompt "
            "ending in a partial answer) afresh, like a server that ignores them.",
        ),
    ] = _DEFAULTS.ignore_continuations,
    prefix_cache_blocks: Annotated[
        int, Opt(help="Prefix cache size in blocks, least recently used evicted (0: no cache).")
    ] = _DEFAULTS.prefix_cache_blocks,
    block_size: Annotated[int, Opt(help="Tokens per prefix-cache block.")] = _DEFAULTS.block_size,
    prefill_time_per_token: Annotated[
        float, Opt(help="Seconds of prefill per prompt token not in the prefix cache.")
    ] = _DEFAULTS.prefill_time_per_token,
    p_500: Annotated[float, Opt(help="Probability of an HTTP 500.")] = _DEFAULTS.p_500,
    p_429: Annotated[float, Opt(help="Probability of an HTTP 429.")] = _DEFAULTS.p_429,
    p_stall: Annotated[float, Opt(help="Probability of a mid-stream stall.")] = _DEFAULTS.p_stall,
    p_disconnect: Annotated[
        float, Opt(help="Probability of a mid-stream dropped connection.")
    ] = _DEFAULTS.p_disconnect,
    stall_seconds: Annotated[float, Opt(help="How long a stall lasts.")] = _DEFAULTS.stall_seconds,
    fail_first: Annotated[
        int, Opt(help="The first N attempts of each distinct prompt get HTTP 500.")
    ] = _DEFAULTS.fail_first,
    disconnect_first: Annotated[
        int,
        Opt(
            help="The next N attempts of each distinct prompt (after --fail-first) drop the "
            "connection mid-stream; a continuation counts as an attempt of the prompt it continues."
        ),
    ] = _DEFAULTS.disconnect_first,
    cut_at: Annotated[
        int, Opt(help="Tokens sent before a mid-stream fault (0: a random cut point).")
    ] = _DEFAULTS.cut_at,
    seed: Annotated[int, Opt(help="Seed of the fault draws.")] = _DEFAULTS.seed,
    vary_answers: Annotated[
        bool,
        Opt(
            "--vary-answers",
            help="Chat requests at temperature > 0 each draw an answer of their own (as a "
            "real server samples); at 0 the prompt's answer stays the same.",
        ),
    ] = _DEFAULTS.vary_answers,
    abort_requests: Annotated[
        bool,
        Opt(
            "--abort-requests/--no-abort-requests",
            help="Serve POST /inference/v1/abort_requests (stops the named generations); "
            "--no-abort-requests answers 403, as vLLM does without --enable-scale-out.",
        ),
    ] = _DEFAULTS.abort_requests,
    tool_mismatch_share: Annotated[
        float, Opt(help="Share of tool-call answers that call another function than named.")
    ] = _DEFAULTS.tool_mismatch_share,
    log_path: Annotated[
        Path | None, Opt("--log", "--log-path", help="JSONL file, one line per generation end.")
    ] = _DEFAULTS.log_path,
    hidden_states_model: Annotated[
        Path | None,
        Opt(
            help="Serve vLLM's hidden-state extraction: a token-id completion with max_tokens 1 "
            "writes this model's real states (transformers, CPU) to a file it names."
        ),
    ] = None,
    hidden_states_dir: Annotated[
        Path | None, Opt(help="Folder of the hidden-state files (shared_storage_path).")
    ] = None,
    hidden_states_layers: Annotated[
        str, Opt(help="eagle_aux_hidden_state_layer_ids, i,j,k,L (0: embeddings; L: last).")
    ] = "",
    hidden_states_wrong_ids: Annotated[
        bool, Opt("--hidden-states-wrong-ids", help="Fault: echo and write other prompt ids.")
    ] = False,
    hidden_states_zeros: Annotated[
        bool,
        Opt("--hidden-states-zeros", help="Fault: the first layer's states are all zeros."),
    ] = False,
) -> None:
    """Run the simulator (stand-in for vLLM, not a model)."""
    from simulator.server import serve  # deferred: keeps the main CLI's start-up light

    try:
        cfg = SimConfig(
            model_name=model_name,
            time_per_token=time_per_token,
            fast_chunk_tokens=fast_chunk_tokens,
            ttft=ttft,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            over_context=over_context.value,
            min_answer_tokens=min_answer_tokens,
            max_answer_tokens=max_answer_tokens,
            long_answer_share=long_answer_share,
            long_answer_tokens=long_answer_tokens,
            reasoning_tokens=reasoning_tokens,
            reasoning_field=reasoning_field.value,
            token_ids=token_ids,
            prefix_cache_blocks=prefix_cache_blocks,
            block_size=block_size,
            prefill_time_per_token=prefill_time_per_token,
            p_500=p_500,
            p_429=p_429,
            p_stall=p_stall,
            p_disconnect=p_disconnect,
            stall_seconds=stall_seconds,
            fail_first=fail_first,
            disconnect_first=disconnect_first,
            cut_at=cut_at,
            ignore_continuations=ignore_continuations,
            seed=seed,
            vary_answers=vary_answers,
            abort_requests=abort_requests,
            tool_mismatch_share=tool_mismatch_share,
            log_path=log_path,
            hidden_states_model=hidden_states_model,
            hidden_states_dir=hidden_states_dir,
            hidden_states_layers=[int(p) for p in hidden_states_layers.split(",") if p.strip()],
            hidden_states_wrong_ids=hidden_states_wrong_ids,
            hidden_states_zeros=hidden_states_zeros,
        )
    except (ValidationError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(
        f"simulator (stand-in for vLLM, not a model) listening on http://{host}:{port}/v1 "
        f"model={cfg.model_name}"
    )
    serve(cfg, host=host, port=port)


def register(app: typer.Typer) -> None:
    """Add the `simulate` command to a Typer app."""
    app.command("simulate", help=HELP, short_help="Run the vLLM stand-in (not a model).")(simulate)
