"""The simulator's --vary-answers: at temperature > 0 each request draws its own answer."""

from __future__ import annotations

from simulator.answers import expected_answer, prompt_key
from simulator.config import SimConfig
from simulator.sampling import sampled

MESSAGES = [{"role": "user", "content": "tell me something"}]
CFG = SimConfig(vary_answers=True, min_answer_tokens=20, max_answer_tokens=40)


def _content(vary: bool, temperature: float | None, request: int) -> str:
    with sampled(vary, temperature, request):
        return expected_answer(MESSAGES, 100, CFG).content


def test_requests_that_sample_draw_answers_of_their_own_still_keyed_by_their_prompt():
    first, second = _content(True, 0.7, 1), _content(True, 0.7, 2)
    assert first != second
    assert first.startswith(f"[{prompt_key(MESSAGES)}]") and second.startswith(
        f"[{prompt_key(MESSAGES)}]"
    )


def test_greedy_requests_and_the_default_keep_the_prompts_one_answer():
    plain = expected_answer(MESSAGES, 100, CFG).content
    assert _content(True, 0.0, 1) == _content(True, None, 2) == plain
    assert _content(False, 0.7, 1) == _content(False, 0.7, 2) == plain
