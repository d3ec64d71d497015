"""Pure-logic tests of the simulator: answers contract, fault decisions, context limits."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from simulator.answers import (
    THINK_CLOSE,
    THINK_OPEN,
    count_prompt_tokens,
    expected_answer,
    inline_content,
    inline_tokens,
    prompt_key,
)
from simulator.config import SimConfig
from simulator.faults import Fault, FaultPlan, context_error, cut_point, request_rng

CFG = SimConfig()


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


# --- prompt_key -------------------------------------------------------------------------------


def test_prompt_key_is_the_sha256_prefix_of_canonical_role_and_content_json() -> None:
    messages = [{"role": "user", "content": "héllo wörld"}]
    canonical = json.dumps(
        [{"role": "user", "content": "héllo wörld"}],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    assert prompt_key(messages) == hashlib.sha256(canonical.encode()).hexdigest()[:16]


def test_different_prompts_get_different_keys() -> None:
    keys = {prompt_key(chat(f"question {i}")) for i in range(500)}
    assert len(keys) == 500


def test_reasoning_content_in_history_does_not_change_the_key() -> None:
    plain = [*chat("q"), {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]
    with_reasoning = [dict(m) for m in plain]
    with_reasoning[2]["reasoning_content"] = "I thought hard"
    assert prompt_key(with_reasoning) == prompt_key(plain)


def test_the_role_is_part_of_the_key() -> None:
    assert prompt_key([{"role": "user", "content": "x"}]) != prompt_key(
        [{"role": "system", "content": "x"}]
    )


# --- count_prompt_tokens ----------------------------------------------------------------------


def test_prompt_tokens_are_four_per_message_plus_whitespace_words() -> None:
    messages = [{"role": "system", "content": "be  brief"}, {"role": "user", "content": "a b\nc"}]
    assert count_prompt_tokens(messages) == (4 + 2) + (4 + 3)


def test_prompt_tokens_count_only_text_parts_of_structured_content() -> None:
    parts = [{"type": "text", "text": "one two"}, {"type": "image_url", "image_url": {}}]
    assert count_prompt_tokens([{"role": "user", "content": parts}]) == 4 + 2
    assert count_prompt_tokens([{"role": "assistant", "content": None}]) == 4


# --- expected_answer --------------------------------------------------------------------------


def test_same_messages_give_the_same_answer() -> None:
    assert expected_answer(chat("q"), None, CFG) == expected_answer(chat("q"), None, CFG)


def test_content_starts_with_the_bracketed_prompt_key() -> None:
    answer = expected_answer(chat("q"), None, CFG)
    assert answer.content_tokens[0] == f"[{prompt_key(chat('q'))}]"
    assert answer.content.startswith(f"[{prompt_key(chat('q'))}] ")


def test_tokens_concatenate_to_the_texts_and_are_counted() -> None:
    answer = expected_answer(chat("q"), None, CFG)
    assert "".join(answer.reasoning_tokens) == answer.reasoning
    assert "".join(answer.content_tokens) == answer.content
    assert answer.completion_tokens == len(answer.reasoning_tokens) + len(answer.content_tokens)
    assert not answer.reasoning.startswith(" ")
    assert all(t.startswith(" ") for t in answer.content_tokens[1:])


def test_answer_lengths_stay_within_the_configured_bounds() -> None:
    cfg = SimConfig(min_answer_tokens=3, max_answer_tokens=7, reasoning_tokens=5)
    for i in range(200):
        answer = expected_answer(chat(str(i)), None, cfg)
        assert 3 <= len(answer.content_tokens) <= 7
        assert 1 <= len(answer.reasoning_tokens) <= 5
        assert answer.finish_reason == "stop"


def test_a_long_tail_lengthens_its_share_of_answers_and_keeps_the_others() -> None:
    plain = SimConfig(min_answer_tokens=3, max_answer_tokens=7)
    tail = plain.model_copy(update={"long_answer_share": 0.25, "long_answer_tokens": 50})
    pairs = [(expected_answer(chat(str(i)), None, plain),
              expected_answer(chat(str(i)), None, tail)) for i in range(400)]  # fmt: skip
    long = [t for _, t in pairs if len(t.content_tokens) == 50]
    assert 60 <= len(long) <= 140  # a quarter of 400, give or take
    # The rest are the answers without a tail, word for word.
    assert all(p == t for p, t in pairs if len(t.content_tokens) != 50)


def test_max_tokens_truncates_the_answer_with_finish_reason_length() -> None:
    full = expected_answer(chat("q"), None, CFG)
    cut = expected_answer(chat("q"), full.completion_tokens - 1, CFG)
    assert cut.finish_reason == "length"
    assert cut.completion_tokens == full.completion_tokens - 1
    assert full.content.startswith(cut.content)


def test_max_tokens_equal_to_the_answer_length_still_stops() -> None:
    full = expected_answer(chat("q"), None, CFG)
    assert expected_answer(chat("q"), full.completion_tokens, CFG) == full


def test_reasoning_consumes_the_max_tokens_budget_first() -> None:
    full = expected_answer(chat("q"), None, CFG)
    cut = expected_answer(chat("q"), len(full.reasoning_tokens), CFG)
    assert cut.reasoning == full.reasoning
    assert cut.content == ""
    assert cut.finish_reason == "length"


def test_without_max_tokens_the_rest_of_the_context_window_is_the_limit() -> None:
    cfg = SimConfig(max_model_len=count_prompt_tokens(chat("q")) + 5, reasoning_tokens=0)
    answer = expected_answer(chat("q"), None, cfg)
    assert answer.completion_tokens == 5
    assert answer.finish_reason == "length"


def test_thinking_off_gives_no_reasoning_and_the_same_content() -> None:
    on = expected_answer(chat("q"), None, CFG, thinking=True)
    off = expected_answer(chat("q"), None, CFG, thinking=False)
    assert off.reasoning == "" and off.reasoning_tokens == []
    assert off.content == on.content


def test_zero_reasoning_tokens_disables_reasoning() -> None:
    answer = expected_answer(chat("q"), None, SimConfig(reasoning_tokens=0))
    assert answer.reasoning_tokens == []


def test_inline_tokens_wrap_the_reasoning_in_think_tags() -> None:
    answer = expected_answer(chat("q"), None, CFG)
    assert inline_content(answer) == THINK_OPEN + answer.reasoning + THINK_CLOSE + answer.content
    assert len(inline_tokens(answer)) == answer.completion_tokens


def test_inline_tokens_leave_the_think_block_open_when_reasoning_is_cut() -> None:
    answer = expected_answer(chat("q"), 1, CFG)
    assert inline_content(answer) == THINK_OPEN + answer.reasoning


# --- faults -----------------------------------------------------------------------------------


def test_fail_first_fails_exactly_the_first_attempts_of_each_prompt() -> None:
    plan = FaultPlan(fail_first=2)
    rng = random.Random(0)
    decisions = [plan.decide("k", attempt, rng) for attempt in (1, 2, 3, 4)]
    assert decisions == [Fault.HTTP_500, Fault.HTTP_500, Fault.NONE, Fault.NONE]


def test_a_certain_probability_always_gives_its_fault() -> None:
    rng = random.Random(0)
    assert {FaultPlan(p_429=1.0).decide("k", i, rng) for i in range(1, 50)} == {Fault.HTTP_429}
    assert {FaultPlan(p_stall=1.0).decide("k", i, rng) for i in range(1, 50)} == {Fault.STALL}


def test_fault_probabilities_are_roughly_respected() -> None:
    plan = FaultPlan(p_500=0.1, p_disconnect=0.2)
    faults = [plan.decide("k", 1, request_rng(0, f"k{i}", 1)) for i in range(5000)]
    assert 0.08 < faults.count(Fault.HTTP_500) / 5000 < 0.12
    assert 0.17 < faults.count(Fault.DISCONNECT) / 5000 < 0.23
    assert Fault.HTTP_429 not in faults


def test_request_rng_depends_on_seed_key_and_attempt_only() -> None:
    draw = request_rng(1, "k", 2).random()
    assert request_rng(1, "k", 2).random() == draw
    assert len({draw, request_rng(2, "k", 2).random(), request_rng(1, "k", 3).random()}) == 3


def test_mid_stream_faults_cut_after_at_least_one_token_and_before_the_end() -> None:
    rng = random.Random(0)
    cuts = [cut_point(10, rng) for _ in range(500)]
    assert min(cuts) == 1 and max(cuts) == 9
    assert cut_point(1, rng) == 1


def test_fault_probabilities_may_not_exceed_one_in_total() -> None:
    with pytest.raises(ValueError):
        SimConfig(p_500=0.6, p_stall=0.6)


# --- context length ---------------------------------------------------------------------------


def test_a_prompt_longer_than_the_context_is_rejected() -> None:
    message = context_error(prompt_tokens=5000, max_tokens=None, max_model_len=4096)
    assert message is not None
    assert message.startswith("This model's maximum context length is 4096 tokens.")
    assert "your prompt contains at least 4097 input tokens" in message  # vLLM 0.32's words
    assert message.endswith("(parameter=input_tokens, value=4097)")


def test_prompt_plus_max_tokens_beyond_the_context_is_rejected() -> None:
    message = context_error(prompt_tokens=4000, max_tokens=100, max_model_len=4096)
    assert message is not None and "you requested 4100 tokens" in message
    assert context_error(prompt_tokens=4000, max_tokens=96, max_model_len=4096) is None
