"""Truthful parameters without a server (issue 33, items 4 and 8): what cut a turn, the
simulator's window as vLLM 0.32 applies it, the suggested max_tokens, the endpoint list."""

from __future__ import annotations

import pytest

from common.models import TurnResult, Usage
from common.settings import Settings
from producer.preflight import advice
from simulator.config import SimConfig
from simulator.plans import fit_context
from worker.pipeline.generate import with_cut


def _turn(finish: str, completion: int) -> TurnResult:
    usage = Usage(prompt_tokens=1391, completion_tokens=completion)
    return TurnResult(content="x", finish_reason=finish, usage=usage)


def test_a_length_finish_short_of_max_tokens_was_cut_by_the_context_window() -> None:
    # Measured on vLLM 0.32: 1,391 prompt tokens + 657 = 2,048 under max_tokens 1500.
    assert with_cut(_turn("length", 657), 1500).cut_by == "context"
    assert with_cut(_turn("length", 1500), 1500).cut_by == "max_tokens"
    assert with_cut(_turn("stop", 657), 1500).cut_by is None
    assert with_cut(_turn("length", 0), 1500).cut_by == "max_tokens"  # no usage: unknown


def test_the_simulator_clamps_max_tokens_to_the_window_as_vllm_0_32_does() -> None:
    clamp = SimConfig(max_model_len=2048, over_context="clamp")
    assert fit_context(1391, 1500, clamp) == (None, 657)
    assert fit_context(100, 1500, clamp) == (None, 1500)
    assert fit_context(1391, None, clamp) == (None, 657)
    refused, _ = fit_context(2048, 1, clamp)
    assert refused is not None and "your request has 2048 input tokens" in refused
    refuse = SimConfig(max_model_len=2048)
    too_long, _ = fit_context(1391, 1500, refuse)
    assert too_long is not None and "maximum context length is 2048" in too_long


def test_the_suggested_max_tokens_leaves_room_for_most_prompts() -> None:
    prompts = [50] * 19 + [3000]  # one row far longer than the rest is left out
    assert advice(2048, prompts).startswith("use at most 1998:")
    assert "no --max-tokens" in advice(2048, [3000] * 20)
    assert advice(2048, []).startswith("use at most 2043")  # nothing known of the prompts


@pytest.mark.parametrize(
    ("endpoints", "reason"),
    [
        ("http://a:8000/v1 http://b:8000/v1", "comma-separated"),
        ("http://a:8000/v1;http://b:8000/v1", "comma-separated"),
        ("http://a:8000/x;y/v1", "must be an http"),
        ("http://a:8000/v1?x=/v1", "must be an http"),
        ("http://:8000/v1", "names no host"),
        ("http://a:99999/v1", "no valid port"),
        ("a:8000/v1", "must be an http"),
    ],
)
def test_eaglegen_endpoints_is_a_comma_separated_list_of_urls(endpoints: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Settings(endpoints=endpoints)


def test_commas_with_spaces_around_them_separate_endpoints() -> None:
    found = Settings(endpoints="http://a:8000/v1, https://b/v1/").endpoints
    assert found == ["http://a:8000/v1", "https://b/v1"]
