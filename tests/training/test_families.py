"""Real chat templates of each model family, with local tokenizers carrying their tokens.

For every family: the masked tokens of each row decode to exactly the text the model generated
(its reasoning where the model produced it, the answer, the end-of-turn token), and the tokens
before each trained turn are exactly ``apply_chat_template(history, add_generation_prompt=True)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import datasets
import pytest

from tests.training.helpers import masked_runs, quiet, write_jsonl
from tests.training.local_tokenizers import FAMILIES, cached_tokenizer
from training.tokenize import tokenize

SYSTEM = "You are a careful assistant."
TURNS = (
    ("What is two plus two?", "Two and two make four.", "The answer is 4.\n\nDone."),
    ("And three plus five?", "Add them: three, then five.", "It is 8."),
)
DS_EOS = "<｜end▁of▁sentence｜>"


@dataclass(frozen=True)
class Expect:
    """What a family's rows look like: reasoning or not, per-turn rows or not, trained text."""

    reasoning: bool
    per_turn: bool
    text: Callable[[str, str], str]


EXPECT = {
    "qwen3": Expect(True, True, lambda r, c: f"<think>\n{r}\n</think>\n\n{c}<|im_end|>"),
    "qwen3_legacy": Expect(True, True, lambda r, c: f"<think>\n{r}\n</think>\n\n{c}<|im_end|>"),
    "llama3_1": Expect(False, False, lambda r, c: f"{c}<|eot_id|>"),
    "llama3_2": Expect(False, False, lambda r, c: f"{c}<|eot_id|>"),
    "deepseek_r1": Expect(True, True, lambda r, c: f"{r}</think>{c}{DS_EOS}"),
    "deepseek_r1_distill": Expect(True, True, lambda r, c: f"{r}</think>{c}{DS_EOS}"),
    "deepseek_v3_1": Expect(False, False, lambda r, c: f"{c}{DS_EOS}"),
    "deepseek_v3_1_thinking": Expect(True, True, lambda r, c: f"{r}</think>{c}{DS_EOS}"),
    "kimi_k2_instruct": Expect(False, False, lambda r, c: f"{c}<|im_end|>"),
    "kimi_k2_thinking": Expect(True, True, lambda r, c: f"<think>{r}</think>{c}<|im_end|>"),
    "glm4_5": Expect(True, True, lambda r, c: f"\n<think>{r}</think>\n{c}"),
    "gpt_oss": Expect(
        True,
        True,
        lambda r, c: (
            f"<|channel|>analysis<|message|>{r}<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{c}<|return|>"
        ),
    ),
}


def messages(turns: int, reasoning: bool) -> list[dict]:
    """Return a conversation with a system prompt and the first `turns` turns."""
    out = [{"role": "system", "content": SYSTEM}]
    for user, thought, answer in TURNS[:turns]:
        out.append({"role": "user", "content": user})
        out.append({"role": "assistant", "content": answer})
        if reasoning:
            out[-1]["reasoning_content"] = thought
    return out


def prompt_ids(tok, history: list[dict], kwargs: dict) -> list[int]:
    """Return what the server was given: the history with the generation prompt, tokenized."""
    return tok.apply_chat_template(
        history, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )


def record(rid: str, family: str, turns: int) -> dict:
    """Return a collector record whose prompt_tokens are the true prompt lengths."""
    tok, kwargs = cached_tokenizer(family), FAMILIES[family].kwargs
    conv = messages(turns, EXPECT[family].reasoning)
    at = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    usage = [{"usage": {"prompt_tokens": len(prompt_ids(tok, conv[:i], kwargs))}} for i in at]
    gen = {"finish_reason": "stop", "turns": usage, "params": {"chat_template_kwargs": kwargs}}
    return {"schema": 1, "id": rid, "conversations": conv, "generation": gen}


@pytest.fixture(scope="module", params=sorted(EXPECT))
def family_run(request, tmp_path_factory):
    """Tokenize a one-turn and a two-turn record of one family; return what came out."""
    family = request.param
    tmp = tmp_path_factory.mktemp(family)
    write_jsonl(tmp / "in.jsonl", [record("one", family, 1), record("two", family, 2)])
    stats = tokenize(tmp / "in.jsonl", cached_tokenizer(family), tmp / "out", **quiet())
    rows = list(datasets.load_from_disk(str(tmp / "out" / "dataset")))
    lines = (tmp / "out" / "conversations.jsonl").read_text().splitlines()
    return family, stats, rows, [json.loads(line) for line in lines]


def trained_turns(conversation: list[dict], row_id: str, per_turn: bool) -> list[int]:
    """Return the indices of the assistant messages a row trains on."""
    at = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    return at[-1:] if per_turn and "-t" in row_id else at


def test_each_family_gets_one_row_per_turn_only_where_the_template_rewrites_history(family_run):
    family, stats, rows, _ = family_run
    expected = ["one", "two-t0", "two-t1"] if EXPECT[family].per_turn else ["one", "two"]
    assert [r["id"] for r in rows] == expected
    assert stats.rows_out == len(expected) and stats.bad_rows == 0


def test_masked_tokens_decode_to_exactly_what_the_model_generated(family_run):
    family, _, rows, convs = family_run
    tok, expect = cached_tokenizer(family), EXPECT[family]
    for row, conv in zip(rows, convs, strict=True):
        runs = masked_runs(row["loss_mask"])
        msgs = conv["conversations"]
        trained = trained_turns(msgs, row["id"], expect.per_turn)
        texts = [
            expect.text(msgs[i].get("reasoning_content", ""), msgs[i]["content"]) for i in trained
        ]
        assert [tok.decode(row["input_ids"][a:b]) for a, b in runs] == texts


def test_tokens_before_each_trained_turn_are_the_servers_prompt(family_run):
    family, stats, rows, convs = family_run
    tok, kwargs = cached_tokenizer(family), FAMILIES[family].kwargs
    for row, conv in zip(rows, convs, strict=True):
        msgs = conv["conversations"]
        trained = trained_turns(msgs, row["id"], EXPECT[family].per_turn)
        for (start, _), i in zip(masked_runs(row["loss_mask"]), trained, strict=True):
            assert row["input_ids"][:start] == prompt_ids(tok, msgs[:i], kwargs)
    assert stats.prompt_checks == 3 and stats.prompt_mismatches == 0


def test_reasoning_a_template_cannot_show_is_counted_not_invented(tmp_path):
    row = record("r", "llama3_1", 1)
    row["conversations"][-1]["reasoning_content"] = "thinking"
    write_jsonl(tmp_path / "in.jsonl", [row])
    stats = tokenize(tmp_path / "in.jsonl", cached_tokenizer("llama3_1"), tmp_path / "o", **quiet())
    assert stats.reasoning_dropped_turns == 1 and stats.spliced_turns == 0


def test_multi_turn_qwen3_gives_one_row_per_turn_with_the_history_the_server_saw(tmp_path):
    tok = cached_tokenizer("qwen3")
    write_jsonl(tmp_path / "in.jsonl", [record("two", "qwen3", 2)])
    tokenize(tmp_path / "in.jsonl", tok, tmp_path / "out", **quiet())
    first, second = datasets.load_from_disk(str(tmp_path / "out" / "dataset"))
    history = tok.decode(second["input_ids"][: masked_runs(second["loss_mask"])[0][0]])
    assert "Two and two make four." not in history  # Qwen3 drops earlier reasoning
    assert history.endswith(
        "<|im_start|>assistant\nThe answer is 4.\n\nDone.<|im_end|>\n"
        "<|im_start|>user\nAnd three plus five?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "Two and two make four." in tok.decode(first["input_ids"])
