"""Pure tests of the simulator's tokenizer, chat template, raw output and prefix cache."""

from __future__ import annotations

import random

import pytest

from simulator.answers import WORDS, expected_answer, prompt_key
from simulator.config import SimConfig
from simulator.output import generation, model_output, resume_point
from simulator.prefix_cache import PrefixCache
from simulator.tokenizer import (
    IM_END,
    IM_START,
    KEY,
    NEWLINE,
    THINK,
    THINK_END,
    VOCAB_SIZE,
    WORD_IDS,
    decode,
    decode_prompt,
    encode_chat,
    encode_prompt,
    encode_text,
    parse,
)

CFG = SimConfig()


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


# --- tokenizer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain words",
        "  leading and trailing  \n",
        "héllo wörld ✓ 🦅",
        "<think>x</think>y",
        "alphabet",
    ],
)
def test_ids_decode_back_to_the_text(text: str) -> None:
    assert decode(encode_text(text)) == text


def test_answer_words_are_one_id_each_and_the_vocabulary_is_small() -> None:
    assert encode_text(" alpha bravo") == [WORD_IDS[" alpha"], WORD_IDS[" bravo"]]
    assert encode_text("Alpha") == [WORD_IDS["Alpha"]]
    assert len(WORD_IDS) == len(set(WORD_IDS.values())) and VOCAB_SIZE < 40_000
    assert {w for w in WORDS} <= set(WORD_IDS)


def test_unknown_text_falls_back_to_utf8_bytes() -> None:
    assert encode_text("é") == list("é".encode())


def test_other_words_go_by_letter_chunks_about_three_characters_a_token() -> None:
    text = "Explain the difference between a process and a thread, with examples."
    ids = encode_text(text)
    assert len(text) / 3.5 < len(ids) < len(text) / 2
    assert encode_text(" quux") == encode_text(" quu")[:1] + encode_text("x")


def test_random_text_round_trips() -> None:
    rng = random.Random(0)
    alphabet = "abcxyzXYZ éü\n\t<>[]|/think_imstart0123"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert decode(encode_text(text)) == text


def test_the_key_is_one_id_only_where_it_is_the_conversations_key() -> None:
    key = prompt_key(chat("q"))
    assert encode_text(f"[{key}] alpha", key) == [KEY, WORD_IDS[" alpha"]]
    assert KEY not in encode_text(f"[{key}] alpha")
    assert decode([KEY], key) == f"[{key}]"
    with pytest.raises(ValueError, match="outside an assistant turn"):
        decode([KEY])


def test_the_template_renders_messages_and_the_generation_prompt() -> None:
    ids = encode_chat(chat("hi"))
    text = decode_prompt(ids)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert encode_chat(chat("hi"), thinking=False) == [*ids, THINK, THINK_END]
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2 and ids[-1] == NEWLINE


def test_a_rendered_chat_parses_back_to_its_messages() -> None:
    answer = expected_answer(chat("q"), None, CFG).content
    history = [
        *chat("q"),
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "é"},
    ]
    ids = encode_chat(history)
    assert KEY in ids
    parsed = parse(ids)
    assert parsed.structured and parsed.messages == history
    assert (parsed.open_role, parsed.open_ids) == ("assistant", [])


def test_prompt_text_and_prompt_ids_convert_both_ways() -> None:
    answer = expected_answer(chat("q"), None, CFG).content
    history = [
        *chat("q"),
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "r"},
    ]
    ids = encode_chat(history)
    assert encode_prompt(decode_prompt(ids)) == ids


def test_text_outside_the_template_is_not_structured() -> None:
    assert not parse(encode_text("just text")).structured


# --- raw output -------------------------------------------------------------------------------


def test_the_output_wraps_reasoning_in_think_tokens_and_ends_on_end_of_turn() -> None:
    answer = expected_answer(chat("q"), None, CFG)
    output = model_output(chat("q"), CFG)
    ids = [t.id for t in output]
    n = len(answer.reasoning_tokens)
    assert ids[0] == THINK and ids[n + 1] == THINK_END and ids[n + 2] == KEY and ids[-1] == IM_END
    assert len(ids) == answer.completion_tokens + 3
    assert "".join(t.text for t in output) == f"<think>{answer.reasoning}</think>{answer.content}"


def test_without_reasoning_there_are_no_think_tokens() -> None:
    output = model_output(chat("q"), CFG, thinking=False)
    assert THINK not in [t.id for t in output]
    assert output[0].id == KEY


def test_a_generation_stops_on_end_of_turn_or_is_cut_by_the_limit() -> None:
    output = model_output(chat("q"), CFG)
    full = generation(output, 0, 10_000)
    assert full.finish_reason == "stop" and full.token_ids[-1] == IM_END
    cut = generation(output, 0, len(output) - 1)  # everything but the end of turn
    assert cut.finish_reason == "length" and cut.completion_tokens == len(output) - 1
    assert generation(output, 5, 3).token_ids == [t.id for t in output[5:8]]


@pytest.mark.parametrize("k", [0, 1, 4, 20])
def test_a_partial_output_is_found_at_its_length(k: int) -> None:
    ids = [t.id for t in model_output(chat("q"), CFG)]
    found = resume_point(chat("q"), ids[:k], CFG, thinking=True)
    assert found is not None and found.start == k


def test_a_content_only_partial_continues_the_content() -> None:
    content = [t.id for t in model_output(chat("q"), CFG, thinking=False)]
    found = resume_point(chat("q"), content[:3], CFG, thinking=True)
    assert found is not None and [t.id for t in found.output] == content


def test_a_partial_the_model_would_not_write_is_not_found() -> None:
    assert resume_point(chat("q"), encode_text(" zulu zulu zulu"), CFG, thinking=True) is None


# --- prefix cache -----------------------------------------------------------------------------


def test_a_lookup_counts_whole_cached_blocks_and_never_the_last_token() -> None:
    cache = PrefixCache(capacity=100, block_size=4)
    ids = list(range(12))
    assert cache.lookup(ids) == 0
    cache.insert(ids)
    assert cache.lookup(ids) == 8  # the last token is recomputed, so its block is too
    assert cache.lookup([*ids, 99]) == 12
    assert cache.lookup([*ids[:5], 7, 7, 7, 7]) == 4  # a differing block breaks the chain


def test_blocks_hash_cumulatively() -> None:
    cache = PrefixCache(capacity=100, block_size=2)
    cache.insert([1, 2, 3, 4, 5])
    assert cache.lookup([9, 9, 3, 4, 0]) == 0  # block 2 matches only after the same block 1


def test_the_least_recently_used_blocks_go_first_and_a_prefix_outlives_its_extension() -> None:
    cache = PrefixCache(capacity=3, block_size=1)
    cache.insert([1, 2, 3, 0])
    assert len(cache) == 3
    cache.insert([5])
    assert cache.lookup([1, 2, 0]) == 2  # the tail block [1,2,3] was evicted, not [1]
    assert cache.lookup([1, 2, 3, 4, 0]) == 2


def test_a_zero_capacity_cache_never_hits() -> None:
    cache = PrefixCache(capacity=0, block_size=16)
    cache.insert(list(range(64)))
    assert cache.lookup(list(range(64))) == 0
