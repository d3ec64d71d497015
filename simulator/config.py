"""Configuration of the vLLM simulator (a stand-in for vLLM, not a model)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

ReasoningField = Literal["reasoning", "reasoning_content", "inline"]


class SimConfig(BaseModel):
    """Behaviour of one simulated vLLM server: capacity, pacing, answer shape and faults."""

    model_config = ConfigDict(extra="forbid")

    model_name: str = "eaglegen-sim"
    time_per_token: float = Field(default=0.0, ge=0.0)  # seconds; 0 = no sleep, in chunks of:
    fast_chunk_tokens: int = Field(default=16, ge=1)  # tokens per chunk at time_per_token 0
    ttft: float = Field(default=0.0, ge=0.0)  # seconds to first token once a slot is free
    max_num_seqs: int = Field(default=64, ge=1)  # running sequences; the rest wait FIFO
    max_model_len: int = Field(default=4096, ge=2)  # prompt + completion tokens
    # A request whose prompt + max_tokens is over max_model_len: refused with a 400, or served
    # with max_tokens cut to the window left (vLLM 0.32 does; simulator/plans.py fit_context).
    over_context: Literal["refuse", "clamp"] = "refuse"
    min_answer_tokens: int = Field(default=16, ge=1)
    max_answer_tokens: int = Field(default=256, ge=1)
    # A long tail, as reasoning models' answer lengths have: this share of answers (drawn per
    # prompt) has long_answer_tokens of content instead. 0 keeps every answer as before.
    long_answer_share: float = Field(default=0.0, ge=0.0, le=1.0)
    long_answer_tokens: int = Field(default=1024, ge=1)
    reasoning_tokens: int = Field(default=32, ge=0)  # upper bound; 0 = no reasoning
    reasoning_field: ReasoningField = "reasoning"  # inline = <think>…</think> in content
    token_ids: bool = True  # False: no return_token_ids, no token-id prompts (like SGLang)
    # True: a server that ignores continuation requests (continue_final_message, a token-id
    # prompt's partial answer) and answers afresh, as some OpenAI-compatible servers do.
    ignore_continuations: bool = False
    prefix_cache_blocks: int = Field(default=4096, ge=0)  # LRU capacity; 0 = no cache
    block_size: int = Field(default=16, ge=1)  # tokens per prefix-cache block, as vLLM's
    prefill_time_per_token: float = Field(default=0.0, ge=0.0)  # seconds per uncached token
    p_500: float = Field(default=0.0, ge=0.0, le=1.0)
    p_429: float = Field(default=0.0, ge=0.0, le=1.0)
    p_stall: float = Field(default=0.0, ge=0.0, le=1.0)
    p_disconnect: float = Field(default=0.0, ge=0.0, le=1.0)
    stall_seconds: float = Field(default=3600.0, ge=0.0)
    fail_first: int = Field(default=0, ge=0)  # first N attempts of each prompt get HTTP 500
    # The next N attempts of each prompt (after fail_first) drop the connection mid-stream.
    disconnect_first: int = Field(default=0, ge=0)
    cut_at: int = Field(default=0, ge=0)  # tokens sent before a mid-stream fault; 0 = random
    seed: int = 0
    vary_answers: bool = False  # chat requests at temperature > 0 each draw their own answer
    # POST /inference/v1/abort_requests stops the named generations; False: 403, as vLLM
    # answers without --enable-scale-out.
    abort_requests: bool = True
    # Of the answers that call tools, the share calling another function than the messages
    # name (simulator/tool_calls.py): a source conversation's calls then do not match.
    tool_mismatch_share: float = Field(default=0.0, ge=0.0, le=1.0)
    log_path: Path | None = None  # JSONL, one line per generation end
    # vLLM's hidden-state extraction (simulator/hidden_states.py): a token-id completion with
    # max_tokens 1 writes this model's real states (transformers, CPU) of these layer ids
    # (eagle_aux_hidden_state_layer_ids) to a file in this folder, named in the answer.
    hidden_states_model: Path | None = None
    hidden_states_dir: Path | None = None
    hidden_states_layers: list[int] = Field(default_factory=list)
    hidden_states_wrong_ids: bool = False  # a fault: the echo and the file name other ids
    hidden_states_zeros: bool = False  # a fault: the first layer's states all zero (#46301)

    @model_validator(mode="after")
    def _check_ranges(self) -> Self:
        if self.max_answer_tokens < self.min_answer_tokens:
            raise ValueError("max_answer_tokens must be >= min_answer_tokens")
        # One uniform draw picks at most one fault, so the probabilities share the unit interval.
        if self.p_500 + self.p_429 + self.p_stall + self.p_disconnect > 1.0 + 1e-9:
            raise ValueError("p_500 + p_429 + p_stall + p_disconnect must be <= 1")
        if self.hidden_states_model is not None and (
            self.hidden_states_dir is None or not self.hidden_states_layers
        ):
            raise ValueError("hidden_states_model needs hidden_states_dir and hidden_states_layers")
        return self
