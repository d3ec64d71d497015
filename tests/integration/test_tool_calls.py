"""Tool-calling conversations end to end: the bundled sample through real workers, the
simulator, the collector, ``tokenize`` and ``export``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from producer.formats import to_prompt
from producer.tools import ToolConversation
from simulator.hf_tokenizer import save
from simulator.tool_calls import named_functions
from tests.harness import ROOT, wait_for
from tests.hostile import HostileServer
from tests.stack import Stack
from tests.training.helpers import masked_runs

OPENAI = ROOT / "data" / "tool_calls_openai.jsonl"
SHAREGPT = ROOT / "data" / "tool_calls_sharegpt.json"
VALID = {OPENAI: 21, SHAREGPT: 15}  # the rest are invalid rows (scripts/tool_calls_sample.py)


def _rows(path: Path) -> list[dict]:
    text = path.read_text()
    return (
        json.loads(text)
        if path.suffix == ".json"
        else [json.loads(x) for x in text.split("\n") if x]
    )


def expected_stops() -> dict[str, int | None]:
    """First user/tool text of each valid source row -> the turn its conversation stops at (the
    simulator calls the functions the messages name), None when kept whole."""
    out: dict[str, int | None] = {}
    for found in _conversations():
        names = [t["function"]["name"] for t in found.tools]
        since: list[dict] = []
        stop, turn = None, 0
        for m in found.messages:
            if m["role"] != "assistant":
                since.append(m)
                continue
            made = named_functions(since, names)
            if stop is None and made != [c["function"]["name"] for c in m.get("tool_calls", [])]:
                stop = turn
            since, turn = [], turn + 1
        out[_key(found.tools, found.messages[0]["content"])] = stop
    return out


def _conversations() -> Iterator[ToolConversation]:
    """The valid rows of the bundled sample, as the producer reads them."""
    for path in VALID:
        fmt = "openai" if path == OPENAI else "sharegpt"
        for row in _rows(path):
            try:
                found = to_prompt(row, fmt).tools
            except ValueError:
                continue
            assert found is not None
            yield found


def _key(tools: list[dict], first: str) -> str:
    return json.dumps([tools, first], sort_keys=True)


def _run(stack: Stack, *options: str) -> list[dict]:
    stack.simulator()
    stack.worker(concurrency=8)
    stack.collector()
    for path, valid in VALID.items():
        done = stack.enqueue(path, *options)
        assert f"enqueued {valid}," in done.stdout + done.stderr
    stack.wait_complete()
    return stack.lines()


def test_the_bundled_sample_is_regenerated_on_policy_while_the_calls_match(stack: Stack):
    records = _run(stack)
    expected = expected_stops()
    assert len(records) == len(expected) == 36
    for record in records:
        conv, gen = record["conversations"], record["generation"]
        first = next(m for m in conv if m["role"] == "user")["content"]
        stop = expected[_key(record["tools"], first)]
        assert gen.get("stop_turn") == stop, record["id"]
        assert (gen.get("stop_reason") == "tool_call_mismatch") == (stop is not None)
        _assert_calls_and_results_agree(record)
    stopped = sum(v is not None for v in expected.values())
    tools = _status(stack)["tool_calls"]
    assert (tools["conversations"], tools["kept_whole"], tools["stopped"]) == (36, 36 - stopped,
                                                                               stopped)  # fmt: skip
    assert tools["stopped_at_turn"] == {"0": 2, "1": 1}
    _assert_training_rows(stack)


def _assert_calls_and_results_agree(record: dict) -> None:
    """Each result carries the id of the regenerated call before it; each turn's finish is
    what was streamed; the tools are kept, wrapped, outside the conversation."""
    assert all(t["type"] == "function" and "name" in t["function"] for t in record["tools"])
    answers = [m for m in record["conversations"] if m["role"] == "assistant"]
    turns = record["generation"]["turns"]
    assert len(answers) == len(turns)
    ids: list[str] = []
    for message in record["conversations"]:
        if message["role"] == "assistant":
            ids = [c["id"] for c in message.get("tool_calls", [])]
            assert all(i.startswith("chatcmpl-tool-") for i in ids)
            for call in message.get("tool_calls", []):
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
        elif message["role"] == "tool":
            assert message["tool_call_id"] in ids
    for message, turn in zip(answers, turns, strict=True):
        assert turn["finish_reason"] == ("tool_calls" if message.get("tool_calls") else "stop")


def _status(stack: Stack) -> dict:
    done = stack.procs.run(["status", "--json"], stack.env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _assert_training_rows(stack: Stack) -> None:
    """Rows from the server's ids, each cross-checked against the template's; the mask covers
    the assistant spans (calls included) and never a tool result or definition; export carries
    the tools to both trainers' conversations files."""
    import datasets

    from simulator.hf_tokenizer import build

    save(stack.tmp / "tokenizer")
    out = stack.tmp / "rows"
    command = ["tokenize", str(stack.out), "--tokenizer", str(stack.tmp / "tokenizer"),
               "--out", str(out), "--num-proc", "1", "--no-progress"]  # fmt: skip
    done = stack.procs.run(command, stack.env)
    assert done.returncode == 0, done.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["bad_rows"] == 0 and stats["prompt_mismatches"] == 0
    assert stats["rows_from_ids"] == stats["drift_checks"] == stats["rows_out"] > 36
    assert stats["drift_rows"] == 0  # every row from ids equals the template's, mask included
    rows = list(datasets.load_from_disk(str(out / "dataset")))
    tok = build()
    results = {m["content"] for r in stack.lines() for m in r["conversations"]
               if m["role"] == "tool"}  # fmt: skip
    trained = [
        tok.decode(r["input_ids"][a:b]) for r in rows for a, b in masked_runs(r["loss_mask"])
    ]
    assert any("<tool_call>" in t for t in trained)
    for text in trained:
        assert "<tools>" not in text and "<|im_start|>" not in text
        assert not any(result in text for result in results if len(result) > 4)
    export = stack.tmp / "export"
    done = stack.procs.run(["export", str(out), "--out", str(export)], stack.env, timeout=300)
    assert done.returncode == 0, done.stderr
    for trainer in ("specforge", "speculators"):
        lines = (export / trainer / "conversations.jsonl").read_text().splitlines()
        assert lines and all("tools" in json.loads(line) for line in lines)


def test_original_history_answers_every_source_turn(stack: Stack):
    records = _run(stack, "--history", "original")
    assert len(records) == 36
    for record in records:
        gen = record["generation"]
        assert "stop_reason" not in gen
        assert gen["params"]["history"] == "original"
        answers = [m for m in record["conversations"] if m["role"] == "assistant"]
        assert len(gen["turns"]) == len(answers)
    total_turns = sum(len(r["generation"]["turns"]) for r in records)
    assert total_turns == _source_assistant_turns()


def _source_assistant_turns() -> int:
    return sum(m["role"] == "assistant" for c in _conversations() for m in c.messages)


def _weather_and_time_row() -> dict:
    """A row whose source calls two functions in parallel, then answers in text."""

    def spec(name: str) -> dict:
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}

    def call(cid: str, name: str) -> dict:
        return {"id": cid, "type": "function",
                "function": {"name": name, "arguments": '{"city": "Oslo"}'}}  # fmt: skip

    return {"tools": [spec("get_weather"), spec("get_time")], "messages": [
        {"role": "user", "content": "weather and time in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("s1", "get_weather"), call("s2", "get_time")]},
        {"role": "tool", "tool_call_id": "s1", "content": "rain"},
        {"role": "tool", "tool_call_id": "s2", "content": "12:00"},
        {"role": "assistant", "content": "Rain, noon."},
    ]}  # fmt: skip


def test_parallel_calls_streamed_under_one_index_stay_two_calls_in_order(stack: Stack):
    # Ollama's OpenAI API: both calls at index 0 with their own ids, the second's arguments a
    # JSON object. Two calls, in order, the object sent back as a JSON string.
    source = stack.tmp / "calls.jsonl"
    source.write_text(json.dumps(_weather_and_time_row()) + "\n")
    with HostileServer() as server:
        stack.env |= {"EAGLEGEN_ENDPOINTS": server.endpoint("tools-one-index"),
                      "EAGLEGEN_MODEL": "m"}  # fmt: skip
        stack.worker(concurrency=1)
        stack.collector()
        stack.enqueue(source)
        stack.wait_complete()
        wait_for(stack.lines, 30, "the record")
        [record] = stack.lines()
        sent = server.bodies("tools-one-index")
    assert "stop_reason" not in record["generation"], record["generation"]
    answer = next(m for m in record["conversations"] if m["role"] == "assistant")
    assert answer["tool_calls"] == [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}},
    ]  # fmt: skip
    results = [(m["tool_call_id"], m["content"]) for m in record["conversations"]
               if m["role"] == "tool"]  # fmt: skip
    assert results == [("call_a", "rain"), ("call_b", "12:00")]
    assert record["generation"]["turns"][0]["tool_arguments_serialised"] == 1
    # The next turn sent the calls back as streamed, arguments as JSON strings.
    assert sent[-1]["messages"][1]["tool_calls"] == answer["tool_calls"]
