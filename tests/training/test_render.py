"""Pure tests of training.render with small Python 'templates' (no tokenizer, no Jinja)."""

from __future__ import annotations

import pytest

from training.render import (
    SpanConfig,
    TemplateError,
    conversation_turns,
    generated_end,
    plan_rows,
    span_config,
    trim_scaffolding,
)

END = ("<|end|>",)


def chatml(drop_history_reasoning: bool):
    """A ChatML-like template; optionally drops reasoning from turns before the last user."""

    def render(messages, add_generation_prompt):
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        out = []
        for i, m in enumerate(messages):
            body = m["content"]
            reasoning = m.get("reasoning_content")
            keep = not drop_history_reasoning or i > last_user
            if m["role"] == "assistant" and reasoning is not None and keep:
                body = f"<think>{reasoning}</think>{body}"
            out.append(f"<|{m['role']}|>{body}<|end|>\n")
        if add_generation_prompt:
            out.append("<|assistant|>")
        return "".join(out)

    return render


def r1_like(messages, add_generation_prompt):
    """A DeepSeek-R1-like template: reasoning never rendered, prompt opens the think block."""
    out = []
    for m in messages:
        if m["role"] == "user":
            out.append(f"<U>{m['content']}")
        else:
            out.append(f"<A>{m['content'].split('</think>')[-1]}<eos>")
    if add_generation_prompt:
        out.append("<A><think>\n")
    return "".join(out)


def conv(*turns, reasoning=True):
    """Build messages from (user, reasoning, answer) triples."""
    messages = []
    for user, thought, answer in turns:
        messages.append({"role": "user", "content": user})
        msg = {"role": "assistant", "content": answer}
        if reasoning:
            msg["reasoning_content"] = thought
        messages.append(msg)
    return messages, [i for i, m in enumerate(messages) if m["role"] == "assistant"]


CFG = SpanConfig("test", END)
TWO = (("u1", "r1", "a1"), ("u2", "r2", "a2"))


def test_whitespace_after_a_final_end_token_is_not_part_of_the_generated_text():
    assert trim_scaffolding("answer<|end|>\n", END) == "answer<|end|>"


def test_trailing_whitespace_of_an_answer_without_end_token_is_kept():
    assert trim_scaffolding("answer \n", END) == "answer \n"


def test_the_generated_text_is_the_rendered_turn_minus_the_generation_prompt():
    messages, at = conv(TWO[0])
    (turn,) = conversation_turns(messages, at, chatml(False), CFG)
    assert turn.prompt == "<|user|>u1<|end|>\n<|assistant|>"
    assert turn.span == "<think>r1</think>a1<|end|>"
    assert not turn.spliced


def test_a_template_that_keeps_history_gives_one_row_training_on_every_turn():
    messages, at = conv(*TWO)
    turns = conversation_turns(messages, at, chatml(False), CFG)
    (row,) = plan_rows(turns, "auto")
    assert row.turns() == (0, 1)
    (earlier,) = row.earlier
    assert row.prompt[earlier.prompt_end : earlier.mask_end] == "<think>r1</think>a1<|end|>"


def test_a_template_that_drops_history_reasoning_gives_one_row_per_turn():
    messages, at = conv(*TWO)
    turns = conversation_turns(messages, at, chatml(True), CFG)
    rows = plan_rows(turns, "auto")
    assert [r.turns() for r in rows] == [(0,), (1,)]
    assert "<think>r1</think>" not in rows[1].prompt  # the history the server saw


def test_without_reasoning_a_dropping_template_still_keeps_one_row():
    messages, at = conv(*TWO, reasoning=False)
    turns = conversation_turns(messages, at, chatml(True), CFG)
    assert [r.turns() for r in plan_rows(turns, "auto")] == [(0, 1)]


def test_always_splits_every_turn_even_when_history_is_kept():
    messages, at = conv(*TWO)
    turns = conversation_turns(messages, at, chatml(False), CFG)
    assert [r.turns() for r in plan_rows(turns, "always")] == [(0,), (1,)]


def test_never_keeps_one_row_and_leaves_rewritten_turns_unmasked():
    messages, at = conv(*TWO)
    turns = conversation_turns(messages, at, chatml(True), CFG)
    (row,) = plan_rows(turns, "never")
    assert row.turns() == (1,)
    assert row.unmasked == 1


def test_a_turn_the_template_cannot_render_with_reasoning_is_spliced_in_think_format():
    messages, at = conv(TWO[0])
    (turn,) = conversation_turns(messages, at, r1_like, SpanConfig("r1", ("<eos>",)))
    assert turn.prompt.endswith("<A><think>\n")
    assert turn.span == "r1</think>a1<eos>"
    assert turn.spliced


def test_a_template_breaking_the_prefix_without_think_tags_fails_naming_it():
    messages, at = conv(TWO[0], reasoning=False)
    cfg = SpanConfig("odd.jinja", splice=False)
    with pytest.raises(TemplateError, match=r"odd\.jinja"):
        conversation_turns(messages, at, r1_like, cfg)


def test_reasoning_is_never_spliced_into_a_template_without_think_tags():
    assert not span_config("{{ messages }}", "plain").splice
    messages, at = conv(TWO[0])
    plain = chatml(False)

    def no_reasoning(msgs, agp):
        return plain([{k: v for k, v in m.items() if k != "reasoning_content"} for m in msgs], agp)

    (turn,) = conversation_turns(messages, at, no_reasoning, span_config("x", "plain", END))
    assert turn.span == "a1<|end|>"
    assert turn.reasoning_dropped


def test_a_turn_cut_by_max_tokens_is_masked_only_up_to_its_generated_text():
    span = "<think>r</think>half an answ<|end|>"
    message = {"role": "assistant", "content": "half an answ", "reasoning_content": "r"}
    assert span[: generated_end(span, message, True)] == "<think>r</think>half an answ"
    assert generated_end(span, message, False) == len(span)
