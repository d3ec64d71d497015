"""Tool-calling rows, streamed calls and the history policy, without Redis or HTTP."""

import json

import pytest

from cli.status_view import _tools_line
from common import errors, tool_counts
from common.ids import sample_id
from common.keys import RunKeys
from common.models import GenParams, Sample, SourceRef, TurnResult
from producer.formats import InvalidRow, to_prompt
from producer.tools import tool_identity
from worker.chat.client import translate_errors
from worker.chat.stream import TurnStream
from worker.pipeline.tool_turns import (
    CUT,
    MISMATCH,
    answer_tool_turns,
    build_tool_record,
    request_fields,
    walk,
)

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def _call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _openai_row():
    return {
        "tools": [WEATHER, TIME],
        "messages": [
            {"role": "system", "content": "use tools"},
            {"role": "user", "content": "weather and time in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                _call("s1", "get_weather", '{"city": "Oslo"}'),
                _call("s2", "get_time", '{"city": "Oslo"}'),
            ]},
            {"role": "tool", "tool_call_id": "s2", "content": "12:00"},
            {"role": "tool", "tool_call_id": "s1", "content": "rain"},
            {"role": "assistant", "content": "Rain, noon."},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": "welcome"},
        ],
    }  # fmt: skip


def _sample(row, fmt="openai"):
    prompt = to_prompt(row, fmt)
    found = prompt.tools
    assert found is not None
    return Sample(
        id="x", system=prompt.system, user_turns=prompt.user_turns, tools=found.tools,
        tool_choice=found.tool_choice, script=found.messages,
        source=SourceRef(dataset="d", row=0, format=fmt),
    )  # fmt: skip


def _turn(content="", calls=None, reason="stop"):
    return TurnResult(content=content, tool_calls=calls, finish_reason=reason)


def test_openai_rows_keep_tools_calls_and_results_tied_to_their_calls():
    found = to_prompt(_openai_row(), "openai").tools
    assert found is not None and found.tools == [WEATHER, TIME] and found.system == "use tools"
    tool_msgs = [m for m in found.messages if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["name"]) for m in tool_msgs] == [
        ("s2", "get_time"), ("s1", "get_weather")
    ]  # fmt: skip
    assert found.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_sharegpt_function_calling_rows_wrap_their_specs_and_parse_calls():
    row = {
        "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}]),
        "conversations": [
            {"from": "human", "value": "weather?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"c": 1}}'},
            {"from": "observation", "value": "sun"},
            {"from": "gpt", "value": "sunny"},
        ],
    }
    found = to_prompt(row, "sharegpt").tools
    assert found is not None and found.tools == [WEATHER]
    call = found.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"c": 1}'}
    assert found.messages[2]["tool_call_id"] == call["id"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda r: r.update(tools="[not json"), "not valid JSON"),
        (lambda r: r.update(tools=[{"type": "function", "function": {}}]), "no function name"),
        (lambda r: r.update(tools=[]), "no 'tools'"),
        (lambda r: r["messages"][2]["tool_calls"][0]["function"].update(name="nope"), "not in"),
        (lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="{x"), "JSON"),
        (lambda r: r["messages"].pop(3), "2 tool calls, 1 results"),
        (lambda r: r["messages"][3].update(tool_call_id="zz"), "answers no call"),
    ],
)
def test_invalid_tool_specs_and_calls_make_invalid_rows(change, why):
    row = _openai_row()
    change(row)
    with pytest.raises(InvalidRow, match=why):
        to_prompt(row, "openai")


def test_the_sample_id_covers_the_tools():
    params = GenParams()
    row, other = _openai_row(), _openai_row()
    other["tools"] = [TIME, WEATHER]
    ids = {
        sample_id("use tools", ["q"], tool_identity(to_prompt(r, "openai").tools, params))
        for r in (row, other)
    }
    assert len(ids) == 2
    assert sample_id("s", ["q"], None) == sample_id("s", ["q"])


def _sse(*chunks):
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def test_streamed_parallel_calls_are_joined_by_index_with_exact_ids_and_argument_strings():
    def delta(d, finish=None):
        return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    fn = lambda **kw: {"function": kw}  # noqa: E731
    data = _sse(
        delta({"role": "assistant", "reasoning": "need both"}),
        delta({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-a", "type": "function",
                               **fn(name="get_weather")}]}),
        delta({"tool_calls": [{"index": 1, "id": "chatcmpl-tool-b", "type": "function",
                               **fn(name="get_time")}]}),
        delta({"tool_calls": [{"index": 0, **fn(arguments='{"city":')}]}),
        delta({"tool_calls": [{"index": 1, **fn(arguments='{"tz": "UTC"}')}]}),
        delta({"tool_calls": [{"index": 0, **fn(arguments=' "Oslo" }')}]}),
        delta({}, "tool_calls"),
    )  # fmt: skip
    stream = TurnStream("http://e/v1")
    for i in range(0, len(data), 7):  # fragments split across reads
        stream.feed(data[i : i + 7])
    turn = stream.result(0.1, "m")
    assert turn.finish_reason == "tool_calls" and turn.reasoning == "need both"
    assert turn.tool_calls == [
        _call("chatcmpl-tool-a", "get_weather", '{"city": "Oslo" }'),
        _call("chatcmpl-tool-b", "get_time", '{"tz": "UTC"}'),
    ]


def test_rows_without_tools_send_neither_tools_nor_tool_choice():
    plain = Sample(id="p", user_turns=["q"], source=SourceRef(dataset="d", row=0, format="x"))
    assert request_fields(plain) is None
    assert request_fields(_sample(_openai_row())) == {"tools": [WEATHER, TIME],
                                                      "tool_choice": "auto"}  # fmt: skip


def test_matching_calls_get_the_source_results_with_the_regenerated_ids():
    sample, params = _sample(_openai_row()), GenParams()
    calls = [_call("r1", "get_weather", '{"city":"Oslo"}'), _call("r2", "get_time", "{}")]
    seen = []

    def call(messages):
        seen.append(messages)
        return [_turn(calls=calls, reason="tool_calls"), _turn("noon"), _turn("bye")][len(seen) - 1]

    turns = answer_tool_turns(sample, params, [], call, save=lambda done: None)
    assert len(turns) == 3
    results = [m for m in seen[1] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [("r2", "12:00"), ("r1", "rain")]
    assert seen[1][2]["tool_calls"] == calls and "name" not in results[0]
    record = build_tool_record("run", sample, params, turns, 1)
    assert record.tools == [WEATHER, TIME] and record.generation.stop_reason is None
    assert record.generation.tool_arguments_differ == 2
    assert [m.role for m in record.conversations] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"
    ]  # fmt: skip


def test_a_call_of_another_function_ends_the_conversation_at_that_turn():
    sample, params = _sample(_openai_row()), GenParams()
    wrong = [_call("r1", "get_time", "{}")]
    turns = answer_tool_turns(sample, params, [], lambda m: _turn(calls=wrong), lambda d: None)
    record = build_tool_record("run", sample, params, turns, 1)
    assert len(turns) == 1
    assert (record.generation.stop_reason, record.generation.stop_turn) == (MISMATCH, 0)
    assert record.conversations[-1].tool_calls == wrong


def test_original_history_answers_every_source_turn_after_the_source_messages():
    sample, params = _sample(_openai_row()), GenParams(history="original")
    seen = []

    def call(messages):
        seen.append(messages)
        return _turn(calls=[_call("r1", "get_time", "{}")])  # never the source's calls

    turns = answer_tool_turns(sample, params, [], call, lambda d: None)
    assert len(turns) == 3 and len(seen) == 3
    assert seen[1][2]["tool_calls"][0]["id"] == "s1"  # the source's own turn, not ours
    assert [m["tool_call_id"] for m in seen[1] if m["role"] == "tool"] == ["s2", "s1"]
    assert walk(sample, params, turns).stop_turn is None


def _delta(d, finish=None):
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def _streamed(*fragments, finish="tool_calls"):
    stream = TurnStream("http://e/v1")
    with translate_errors("http://e/v1"):
        stream.feed(_sse(*[_delta({"tool_calls": [f]}) for f in fragments], _delta({}, finish)))
        return stream.result(0.1, "m")


def _fragment(index, cid=None, name=None, arguments=None):
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    return {"index": index, **({"id": cid} if cid else {}), "function": function}


def test_parallel_calls_streamed_under_one_index_with_their_own_ids_stay_apart_in_order():
    # Ollama's OpenAI API: every call whole, each at index 0 with its own id.
    turn = _streamed(
        _fragment(0, "call_a", "get_weather", '{"city": "Oslo"}'),
        _fragment(0, "call_b", "get_time", '{"tz": '),
        _fragment(0, arguments='"UTC"}'),  # no id: the call open at its index
        _fragment(0, "call_c", "get_weather", '{"city": "Rome"}'),
    )
    assert turn.tool_calls == [
        _call("call_a", "get_weather", '{"city": "Oslo"}'),
        _call("call_b", "get_time", '{"tz": "UTC"}'),
        _call("call_c", "get_weather", '{"city": "Rome"}'),
    ]
    assert turn.tool_arguments_serialised is None


def test_a_fragment_naming_another_function_at_an_index_opens_a_new_call():
    turn = _streamed(
        _fragment(0, name="get_weather", arguments="{}"),
        _fragment(0, name="get_time", arguments="{}"),
    )
    assert [c["function"]["name"] for c in turn.tool_calls] == ["get_weather", "get_time"]


def test_one_id_naming_two_functions_is_a_bad_response():
    with pytest.raises(errors.BadResponse, match="two function names"):
        _streamed(_fragment(0, "call_a", "get_weather"), _fragment(0, "call_a", "get_time"))


def test_arguments_sent_as_an_object_are_serialised_once_as_json_and_counted():
    turn = _streamed(_fragment(0, "call_a", "get_weather", {"city": "Oslo", "note": "ø"}))
    assert turn.tool_calls == [_call("call_a", "get_weather", '{"city": "Oslo", "note": "ø"}')]
    assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"city": "Oslo", "note": "ø"}
    assert turn.tool_arguments_serialised == 1
    assert json.loads(turn.stats().model_dump_json())["tool_arguments_serialised"] == 1


@pytest.mark.parametrize(
    ("fragments", "why"),
    [
        ([_fragment(0, 7, "get_weather", "{}")], "id is a int"),
        ([_fragment(0, "call_a", ["get_weather"], "{}")], "name is a list"),
        ([_fragment(0, "call_a", "get_weather", ["{}"])], "arguments are a list"),
        ([_fragment(0, "call_a", "get_weather", 5)], "arguments are a int"),
        (
            [_fragment(0, "call_a", "get_weather", {"a": 1}), _fragment(0, arguments="{}")],
            "continue after a JSON object",
        ),
        ([_fragment(0, "call_a", "get_weather", "{"), _fragment(0, arguments={"a": 1})], "a dict"),
    ],
)
def test_server_supplied_ids_names_and_arguments_of_the_wrong_type_are_a_bad_response(
    fragments, why
):
    with pytest.raises(errors.BadResponse, match=why):
        _streamed(*fragments)


def test_a_tool_turn_cut_at_max_tokens_ends_the_conversation_as_cut_not_as_another_call():
    # Cut inside its first call: the parser sent no call, or a part of one.
    sample, params = _sample(_openai_row()), GenParams()
    for partial in (None, [_call("r1", "get_weather", '{"ci')]):
        cut = _turn(calls=partial, reason="length")
        turns = answer_tool_turns(sample, params, [], lambda m, t=cut: t, lambda d: None)
        record = build_tool_record("run", sample, params, turns, 1)
        assert len(turns) == 1
        assert (record.generation.stop_reason, record.generation.stop_turn) == (CUT, 0)


def test_status_counts_cut_tool_conversations_apart_from_calls_of_another_function(rdb):
    keys = RunKeys("eaglegen", "tools-cut")
    sample = _sample(_openai_row())
    matching = [_call("r1", "get_weather", "{}"), _call("r2", "get_time", "{}")]
    endings = [  # cut at turn 0, cut at turn 1, another function at turn 0, whole
        [_turn(reason="length")],
        [_turn(calls=matching, reason="tool_calls"), _turn("Rain, no", reason="length")],
        [_turn(calls=[_call("r1", "get_time", "{}")], reason="tool_calls")],
        [_turn(calls=matching, reason="tool_calls"), _turn("noon"), _turn("bye")],
    ]
    for turns in endings:
        tool_counts.count(rdb, keys, build_tool_record("run", sample, GenParams(), turns, 1))
    found = tool_counts.read(rdb, keys)
    assert found is not None
    assert (found["kept_whole"], found["stopped"], found["cut"]) == (1, 1, 2)
    assert (found["stopped_at_turn"], found["cut_at_turn"]) == ({"0": 1}, {"0": 1, "1": 1})
    line = _tools_line(found).plain
    assert "stopped at a call of another function 1 (turn 0: 1)" in line
    assert "cut (finish_reason length) 2 (turn 0: 1, turn 1: 1)" in line
