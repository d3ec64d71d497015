import pytest

from producer.formats import InvalidRow, Prompt, detect_format, to_prompt


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "openai"),
        ({"conversations": [{"from": "human", "value": "hi"}]}, "sharegpt"),
        ({"turns": ["hi"]}, "turns"),
        ({"prompt": "hi"}, "prompt"),
        ({"question": "hi"}, "prompt"),
        ({"instruction": "hi", "input": "x"}, "prompt"),
        ({"text": "hi"}, None),
    ],
)
def test_each_format_is_detected_from_its_columns(row, fmt):
    assert detect_format(row) == fmt


def test_openai_rows_keep_system_and_user_turns_and_drop_assistant_turns():
    row = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "old answer"},
            {"role": "user", "content": "q2"},
        ]
    }
    assert to_prompt(row, "openai") == Prompt("be brief", ["q1", "q2"])


def test_sharegpt_rows_map_human_and_gpt_roles():
    row = {
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "q1"},
            {"from": "gpt", "value": "a1"},
            {"from": "human", "value": "q2"},
        ]
    }
    assert to_prompt(row, "sharegpt") == Prompt("sys", ["q1", "q2"])


def test_sharegpt_conversations_may_use_role_and_content():
    row = {"conversations": [{"role": "user", "content": "q"}]}
    assert to_prompt(row, "sharegpt") == Prompt(None, ["q"])


def test_openai_content_parts_are_joined_when_all_text():
    row = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    }
    assert to_prompt(row, "openai").user_turns == ["ab"]


def test_instruction_rows_append_their_input():
    assert to_prompt({"instruction": "do", "input": "this"}, "prompt").user_turns == ["do\n\nthis"]


@pytest.mark.parametrize(
    ("row", "fmt", "reason"),
    [
        ({"messages": [{"role": "assistant", "content": "a"}]}, "openai", "no user turn"),
        ({"messages": [{"role": "user", "content": "   "}]}, "openai", "empty"),
        ({"messages": [{"role": "user", "content": 5}]}, "openai", "not a string"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "openai", "unknown role"),
        ({"messages": ["hi"]}, "openai", "not an object"),
        ({"turns": "hi"}, "turns", "not a list"),
        ({"turns": []}, "turns", "no user turn"),
        ({"prompt": None}, "prompt", "not a string"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "openai",
            "non-text",
        ),
        ({"prompt": "x"}, "openai", "no 'messages'"),
    ],
)
def test_invalid_rows_raise_with_a_reason(row, fmt, reason):
    with pytest.raises(InvalidRow, match=reason):
        to_prompt(row, fmt)


def test_lines_are_counted_with_or_without_a_final_newline(tmp_path):
    from producer.readers import count_lines

    (tmp_path / "a.jsonl").write_bytes(b"{}\n{}\n")
    (tmp_path / "b.jsonl").write_bytes(b"{}\n{}")
    (tmp_path / "c.jsonl").write_bytes(b"")
    assert [count_lines(tmp_path / n) for n in ("a.jsonl", "b.jsonl", "c.jsonl")] == [2, 2, 0]
