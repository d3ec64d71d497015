"""Tool-calling records: rendered with their tools, trained on the assistant spans only."""

from __future__ import annotations

import datasets
import pytest

from tests.training.helpers import masked_runs, quiet, write_jsonl
from tests.training.local_tokenizers import cached_tokenizer
from training.render import TemplateError
from training.tokenize import tokenize

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
CALL = {"id": "chatcmpl-tool-1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
RESULT = "rain and seven degrees"


def _record() -> dict:
    conv = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look it up.",
         "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "name": "get_weather",
         "content": RESULT},
        {"role": "assistant", "content": "It rains in Oslo.", "reasoning_content": "Easy."},
    ]  # fmt: skip
    turns = [{"finish_reason": "tool_calls"}, {"finish_reason": "stop"}]
    return {"schema": 1, "id": "w", "tools": TOOLS, "conversations": conv,
            "generation": {"finish_reason": "stop", "turns": turns}}  # fmt: skip


def test_qwen3_rows_train_on_the_calls_and_answers_never_on_results_or_definitions(tmp_path):
    tok = cached_tokenizer("qwen3")
    write_jsonl(tmp_path / "in.jsonl", [_record()])
    stats = tokenize(tmp_path / "in.jsonl", tok, tmp_path / "out", **quiet())
    rows = list(datasets.load_from_disk(str(tmp_path / "out" / "dataset")))
    assert stats.bad_rows == 0 and rows
    trained = [
        tok.decode(r["input_ids"][a:b]) for r in rows for a, b in masked_runs(r["loss_mask"])
    ]
    assert any('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in t
               for t in trained)  # fmt: skip
    assert any("It rains in Oslo." in t for t in trained)
    joined = "".join(trained)
    assert RESULT not in joined and "Weather of a city" not in joined
    assert "<tool_response>" not in joined and "What is the weather" not in joined
    whole = tok.decode(rows[-1]["input_ids"])
    assert "Weather of a city" in whole and RESULT in whole  # in the prompt, unmasked


def test_a_template_that_cannot_render_tools_is_a_clear_error(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [_record()])
    with pytest.raises(TemplateError, match="does not render tools"):
        tokenize(tmp_path / "in.jsonl", cached_tokenizer("deepseek_r1"), tmp_path / "o", **quiet())
