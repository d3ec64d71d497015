"""Tool-calling samples against real vLLM with a tool parser (``hermes``).

The tiny model's random weights make real calls unlikely (its planted answer path answers in
text): the tier proves the plumbing, the simulator the semantics. vLLM is started with
``--enable-auto-tool-choice --tool-call-parser hermes`` and the tiny model's template with a
tools block in front, so every request of the bundled tool-calling sample carries its tools
into the prompt. The records keep whatever the parser returned, and the training rows, made
from the server's ids, are cross-checked against the same template given the tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT
from tests.stack import Stack
from tests.vllm.server import MODEL_DIR, Server, report, start_server, stop_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

DATA = ROOT / "data"
TOOLS_BLOCK = (
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' + (tools | tojson) + "
    "'</tools><|im_end|>\\n' }}{%- endif %}"
)


def _template(tmp: Path) -> Path:
    saved = MODEL_DIR / "chat_template.jinja"
    if saved.is_file():
        base = saved.read_text()
    else:
        base = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
    path = tmp / "tools.jinja"
    path.write_text(TOOLS_BLOCK + base)
    return path


@pytest.fixture(scope="module")
def tool_server(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("vllm-tools")
    template = _template(tmp)
    options = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    server = start_server(tmp, *options, "--chat-template", str(template))
    report(f"vLLM server with the hermes tool parser ready in {server.started_s} s")
    yield server, template
    stop_server(server)


def test_requests_with_tools_are_accepted_and_rows_from_ids_match_the_template(
    stack: Stack, tool_server: tuple[Server, Path]
) -> None:
    server, template = tool_server
    stack.env["EAGLEGEN_ENDPOINTS"] = server.endpoint
    stack.worker(concurrency=8)
    stack.collector()
    stack.enqueue(DATA / "tool_calls_openai.jsonl", "--max-tokens", "64")
    stack.enqueue(DATA / "tool_calls_sharegpt.json", "--max-tokens", "64")
    stack.wait_complete(600)
    records = stack.lines()
    assert len(records) == 36 and stack.store.counts().failed == 0
    calls = 0
    for record in records:
        assert record["tools"]
        for turn in record["generation"]["turns"]:
            assert turn["prompt_token_ids"] and turn["token_ids"]
            assert turn["finish_reason"] in ("stop", "length", "tool_calls")
        calls += sum(len(m.get("tool_calls", [])) for m in record["conversations"])
    stats = _tokenize(stack, template)
    ends = [r["generation"].get("stop_reason") for r in records]
    report(
        f"tool-calling sample on vLLM (hermes): {len(records)} records, {calls} calls parsed, "
        f"{ends.count('tool_call_mismatch')} stopped at a mismatch, {ends.count('length')} cut, "
        f"{stats['rows_out']} rows from ids, "
        f"{stats['prompt_mismatches']} prompt mismatches, drift {stats['drift_rows']}"
    )
    assert stats["bad_rows"] == 0
    assert stats["rows_from_ids"] == stats["drift_checks"] == stats["rows_out"]
    # The prompt with the tools, as the template renders it, is the server's to the token.
    assert stats["prompt_checks"] == stats["rows_out"] and stats["prompt_mismatches"] == 0
    for example in stats["drift_examples"]:  # the tiny template's known newline, as without tools
        assert "briefly⟦</think>⟧" in example["ids"], example
        assert "briefly⟦\n⟧</think>" in example["template"], example


def _tokenize(stack: Stack, template: Path) -> dict:
    out = stack.tmp / "rows"
    command = ["tokenize", str(stack.out), "--tokenizer", str(MODEL_DIR), "--chat-template",
               str(template), "--out", str(out), "--no-progress"]  # fmt: skip
    done = stack.procs.run(command, stack.env, timeout=300)
    assert done.returncode == 0, done.stderr
    return dict(json.loads((out / "stats.json").read_text()))
