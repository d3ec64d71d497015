"""Reading the collector's JSONL: the accepted row forms and what makes a row bad."""

from __future__ import annotations

import json

import pytest

from training.records import RecordError, parse_line, parse_record, specforge_row

FULL = {
    "schema": 1,
    "id": "3f2a",
    "run": "default",
    "conversations": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": None},
    ],
    "source": {"dataset": "d", "split": "train", "row": 12, "format": "turns"},
    "generation": {
        "model": "m",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 30, "completion_tokens": 40},
        "turns": [
            {"finish_reason": "stop", "usage": {"prompt_tokens": 10}, "latency_s": 1.0},
            {"finish_reason": "length", "usage": {"prompt_tokens": 20}, "latency_s": 1.0},
        ],
        "params": {"max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}},
    },
}


def test_a_collector_record_yields_messages_turn_metadata_and_template_kwargs():
    rec = parse_record(FULL)
    assert rec.id == "3f2a"
    assert rec.assistant_at == (2, 4)
    assert [t.prompt_tokens for t in rec.turns] == [10, 20]
    assert [t.finish_reason for t in rec.turns] == ["stop", "length"]
    assert rec.template_kwargs == {"enable_thinking": False}


def test_reasoning_is_passed_under_both_names_templates_read():
    msg = parse_record(FULL).messages[2]
    assert msg["reasoning_content"] == msg["thinking"] == "r1"
    assert "reasoning_content" not in parse_record(FULL).messages[4]


def test_vllm_reasoning_field_is_accepted_as_reasoning():
    row = {"id": 1, "conversations": [{"role": "user", "content": "q"}]}
    row["conversations"].append({"role": "assistant", "content": "a", "reasoning": "r"})
    assert parse_record(row).messages[1]["reasoning_content"] == "r"


def test_empty_reasoning_is_left_out_as_the_worker_leaves_it_out_of_requests():
    row = {"id": 1, "conversations": [{"role": "user", "content": "q"}]}
    row["conversations"].append({"role": "assistant", "content": "a", "reasoning_content": ""})
    assert "reasoning_content" not in parse_record(row).messages[1]


def test_a_zero_prompt_token_count_means_the_server_reported_none():
    row = json.loads(json.dumps(FULL))
    row["generation"]["turns"][0]["usage"]["prompt_tokens"] = 0
    assert parse_record(row).turns[0].prompt_tokens is None


def test_plain_specforge_rows_are_accepted_without_generation_metadata():
    row = {"id": "x", "conversations": [{"role": "user", "content": "q"}]}
    row["conversations"].append({"role": "assistant", "content": "a"})
    rec = parse_record(row)
    assert rec.turns[0].prompt_tokens is None and rec.template_kwargs == {}


def test_sharegpt_from_value_rows_are_accepted():
    row = {
        "id": "s",
        "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
    }
    assert [m["role"] for m in parse_record(row).messages] == ["user", "assistant"]


def test_messages_after_the_last_answer_are_dropped():
    row = {"id": "x", "conversations": [{"role": "user", "content": "q"}]}
    row["conversations"] += [
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "?"},
    ]
    assert len(parse_record(row).messages) == 2


def test_turn_metadata_of_the_wrong_length_keeps_only_the_last_finish_reason():
    row = json.loads(json.dumps(FULL))
    row["generation"]["turns"] = row["generation"]["turns"][:1]
    rec = parse_record(row)
    assert [t.finish_reason for t in rec.turns] == [None, "length"]
    assert all(t.prompt_tokens is None for t in rec.turns)


def test_a_row_without_id_gets_a_stable_content_hash():
    row = {
        "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    }
    assert parse_record(row).id == parse_record(json.loads(json.dumps(row))).id


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": 1, "conv', "broken JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"id": 1}', "no conversations"),
        (b'{"id": 1, "conversations": [{"role": "user", "content": "q"}]}', "no assistant"),
        (b'{"id": 1, "conversations": [{"role": "user", "content": 3}]}', "not a string"),
        (b'{"id": 1, "conversations": [{"role": "robot", "content": "q"}]}', "no known role"),
        (b'{"id": 1, "conversations": [{"role": "user", "content": "\xff"}]}', "broken JSON"),
    ],
)
def test_bad_rows_raise_a_short_reason(line, reason):
    with pytest.raises(RecordError, match=reason):
        parse_line(line)


def test_specforge_rows_carry_reasoning_only_when_present():
    rec = parse_record(FULL)
    row = specforge_row("3f2a-t1", rec.messages)
    assert row["conversations"][2] == {
        "role": "assistant",
        "content": "a1",
        "reasoning_content": "r1",
    }
    assert row["conversations"][4] == {"role": "assistant", "content": "a2"}
