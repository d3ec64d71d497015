"""Token ids in the records: real workers, the simulator with and without vLLM's extension."""

from __future__ import annotations

import json

from simulator.config import SimConfig
from simulator.hf_tokenizer import save
from simulator.output import model_output
from simulator.tokenizer import IM_END, decode, encode_chat
from tests.harness import ROOT
from tests.stack import Stack

DATA = ROOT / "data"
PROMPTS = DATA / "mt_bench_question.jsonl"  # two user turns each


def histories(record: dict) -> list[list[dict]]:
    """The messages the server saw for each assistant turn (the template drops reasoning)."""
    seen: list[dict] = []
    out = []
    for message in record["conversations"]:
        if message["role"] == "assistant":
            out.append(list(seen))
        seen.append({"role": message["role"], "content": message["content"]})
    return out


def generate(stack: Stack, limit: int, *sim_options: str, **worker_env: str) -> list[dict]:
    """Run ``limit`` bundled prompts through a simulator, a worker and a collector."""
    stack.simulator(*sim_options)
    stack.worker(concurrency=8, **worker_env)
    stack.collector()
    stack.enqueue(PROMPTS, "--limit", str(limit))
    stack.wait_complete()
    return stack.lines()


def test_records_carry_the_servers_prompt_and_completion_ids(stack: Stack):
    records = generate(stack, 12)  # EAGLEGEN_TOKEN_IDS unset: auto
    assert len(records) == 12
    for record in records:
        turns = record["generation"]["turns"]
        answers = [m for m in record["conversations"] if m["role"] == "assistant"]
        assert len(turns) == len(answers) == 2
        for turn, history, answer in zip(turns, histories(record), answers, strict=True):
            assert turn["prompt_token_ids"] == encode_chat(history)
            assert turn["token_ids"] == [t.id for t in model_output(history, SimConfig())]
            assert turn["token_ids"][-1] == IM_END  # stopped on it: it is kept
            assert turn["usage"]["completion_tokens"] == len(turn["token_ids"])
            text = decode(turn["token_ids"][:-1], answer["content"][1:17])
            assert text == f"<think>{answer['reasoning_content']}</think>{answer['content']}"
    _assert_rows_from_ids_equal_the_template_rows(stack)


def _assert_rows_from_ids_equal_the_template_rows(stack: Stack) -> None:
    """`eaglegen tokenize` on the records: from ids and from the template, the same rows."""
    import datasets

    save(stack.tmp / "tokenizer")
    rows = {}
    for source in ("ids", "template"):
        out = stack.tmp / source
        options = ["--out", str(out), "--source", source, "--num-proc", "2", "--no-progress"]
        command = [
            "tokenize",
            str(stack.out),
            "--tokenizer",
            str(stack.tmp / "tokenizer"),
            *options,
        ]
        done = stack.procs.run(command, stack.env)
        assert done.returncode == 0, done.stderr
        stats = json.loads((out / "stats.json").read_text())
        assert stats["rows_out"] == 24 and stats["bad_rows"] == 0
        rows[source] = list(datasets.load_from_disk(str(out / "dataset")))
        if source == "ids":
            assert (stats["rows_from_ids"], stats["drift_checks"], stats["drift_rows"]) == (
                24,
                24,
                0,
            )
    assert rows["ids"] == rows["template"]


def test_auto_keeps_working_on_text_with_a_server_without_ids(stack: Stack):
    records = generate(stack, 6, "--no-token-ids")
    assert len(records) == 6
    for record in records:
        assert all("token_ids" not in t and "prompt_token_ids" not in t
                   for t in record["generation"]["turns"])  # fmt: skip
        assert record["conversations"][1]["content"]
    assert stack.store.counts().failed == 0


def test_off_asks_for_no_ids(stack: Stack):
    records = generate(stack, 4, EAGLEGEN_TOKEN_IDS="off")
    assert len(records) == 4
    assert not any("token_ids" in t for r in records for t in r["generation"]["turns"])


def test_on_fails_samples_permanently_on_a_server_without_ids(stack: Stack):
    assert generate(stack, 3, "--no-token-ids", EAGLEGEN_TOKEN_IDS="on") == []
    counts = stack.store.counts()
    assert (counts.done, counts.failed, counts.retries) == (0, 3, 0)
    for failure in stack.store.failures().values():
        assert failure.kind == "no_token_ids"
        assert "EAGLEGEN_TOKEN_IDS=on requires them" in failure.message
        assert failure.attempts == 1
