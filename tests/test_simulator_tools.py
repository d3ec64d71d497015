"""The simulator's tool calls: who is called, the fragments, ids that match the template."""

import json

from simulator import hf_tokenizer
from simulator.bodies import joined_calls
from simulator.config import SimConfig
from simulator.jobs import ChatRequest
from simulator.plans import Plan, chat_plan


def _tool(name, **props):
    params = {"type": "object", "properties": {p: {"type": t} for p, t in props.items()}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


TOOLS = [_tool("get_weather", city="string", days="integer"), _tool("get_time", tz="string")]
ASK = [{"role": "system", "content": "Use tools."},
       {"role": "user", "content": "Call get_time, then get_weather for Oslo"}]  # fmt: skip


def _plan(messages, cfg=None, **kw) -> Plan:
    req = ChatRequest(messages=messages, tools=TOOLS, return_token_ids=True, max_tokens=500, **kw)
    plan = chat_plan(req, cfg or SimConfig())
    assert isinstance(plan, Plan)
    return plan


def _calls(plan):
    return joined_calls([json.loads(t) for kind, t in plan.output.pieces if kind == "tool"])


def test_the_functions_the_question_names_are_called_in_parallel_in_order():
    plan = _plan(ASK)
    assert plan.output.finish_reason == "tool_calls"
    calls = _calls(plan)
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert set(json.loads(calls[1]["function"]["arguments"])) == {"city", "days"}
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls)


def test_after_the_tool_results_the_answer_is_text():
    calls = _calls(_plan(ASK))
    after = [*ASK, {"role": "assistant", "content": "", "tool_calls": calls},
             {"role": "tool", "tool_call_id": calls[0]["id"], "content": "noon"},
             {"role": "tool", "tool_call_id": calls[1]["id"], "content": "rain"}]  # fmt: skip
    plan = _plan(after)
    assert plan.output.finish_reason == "stop"
    assert not _calls(plan)


def test_a_share_of_answers_calls_another_function_and_tool_choice_none_calls_none():
    names = set()
    for i in range(20):
        ask = [{"role": "user", "content": f"get_weather please, {i}"}]
        names.add(_calls(_plan(ask, SimConfig(tool_mismatch_share=0.5)))[0]["function"]["name"])
    assert names == {"get_weather", "get_time"}
    assert not _calls(_plan(ASK, tool_choice="none"))


def test_the_streamed_ids_are_the_rendered_conversation_tokenized():
    tok = hf_tokenizer.build()
    plan = _plan(ASK)
    prompt = tok.apply_chat_template(ASK, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert tok(prompt, add_special_tokens=False)["input_ids"] == plan.prompt_ids
    reasoning = "".join(t for kind, t in plan.output.pieces if kind == "reasoning")
    turn = {"role": "assistant", "content": "", "reasoning_content": reasoning,
            "tool_calls": _calls(plan)}  # fmt: skip
    full = tok.apply_chat_template([*ASK, turn], tools=TOOLS, tokenize=False)
    generated = [i for ids in plan.output.piece_ids for i in ids]
    ids = tok(full.removesuffix("\n"), add_special_tokens=False)["input_ids"]
    assert ids == plan.prompt_ids + generated
