"""Prefix-cache-aware routing against two real vLLM servers with prefix caching.

Later turns must land on the server of their conversation's first turn, and that server's own
``vllm:prefix_cache_hits`` must rise by at least the earlier turns' prompts (whole blocks).
Two servers at once are heavy on a 2-core machine: marked slow as well as vllm.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import ROOT
from tests.stack import Stack
from tests.vllm.server import Server, report, start_server, stop_server
from worker.endpoints.server_cache import parse_prefix_cache

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

BLOCK = 32  # tokens per KV block (the CPU backend wants a multiple of 32)
# The tiny template's generation prompt ends in "<think>\n", which its rendering of an earlier
# answer does not repeat: a later turn shares the earlier prompt but for those 2 tokens.
GENERATION_PROMPT_TAIL = 2
CONVERSATIONS = 12
LATER = ("Go on, in more detail.", "Now sum it all up in one line.")


@pytest.fixture(scope="module")
def two_servers(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Server]]:
    """Two servers with prefix caching, blocks of ``BLOCK`` tokens."""
    servers: list[Server] = []
    try:
        for i in range(2):
            logs = tmp_path_factory.mktemp(f"vllm-cache-{i}")
            options = ("--enable-prefix-caching", "--block-size", str(BLOCK))
            servers.append(start_server(logs, *options))
            report(f"vLLM server {i} (prefix caching) ready in {servers[-1].started_s} s")
        yield servers
    finally:
        for server in servers:
            stop_server(server)


def _hits(server: Server) -> float:
    counters = parse_prefix_cache(httpx.get(f"{server.url}/metrics", timeout=10).text)
    assert counters is not None, "no vllm:prefix_cache_* counters in /metrics"
    return counters.hits


def _conversations(tmp: Path) -> Path:
    """Three-turn conversations opening with a few hundred tokens of distinct text."""
    questions = [json.loads(line)["turns"][0] for line in
                 (ROOT / "data" / "mt_bench_question.jsonl").read_text().splitlines()]  # fmt: skip
    path = tmp / "conversations.jsonl"
    with path.open("w") as out:
        for i in range(CONVERSATIONS):
            notes = " ".join(questions[(i * 5 + k) % len(questions)] for k in range(5))
            first = f"Conversation {i}. Read these notes, then answer: {notes}"
            out.write(json.dumps({"id": f"conv-{i}", "turns": [first, *LATER]}) + "\n")
    return path


def test_later_turns_land_on_their_first_turns_server_and_hit_its_prefix_cache(
    stack: Stack, two_servers: list[Server], tmp_path: Path
) -> None:
    stack.env["EAGLEGEN_ENDPOINTS"] = ",".join(server.endpoint for server in two_servers)
    before = {server.endpoint: _hits(server) for server in two_servers}
    stack.worker(concurrency=4)
    stack.collector()
    # Greedy, as the tier's other comparisons: the tiny model's planted answers.
    stack.enqueue(_conversations(tmp_path), "--max-tokens", "64", "--temperature", "0")
    stack.wait_complete(timeout=900)

    records = stack.lines()
    assert len(records) == CONVERSATIONS
    expected = dict.fromkeys(before, 0)
    for record in records:
        turns = record["generation"]["turns"]
        first = turns[0]["endpoint"]
        assert [turn["endpoint"] for turn in turns] == [first] * 3, record["id"]
        for previous in turns[:-1]:  # each later turn finds the turn before it cached
            shared = previous["usage"]["prompt_tokens"] - GENERATION_PROMPT_TAIL
            expected[first] += shared // BLOCK * BLOCK
    for server in two_servers:
        gained = _hits(server) - before[server.endpoint]
        report(
            f"vLLM routing: {server.endpoint} hits +{gained:.0f} (>= {expected[server.endpoint]})"
        )
        assert gained >= expected[server.endpoint]
    status = json.loads(stack.procs.run(["status", "--json"], stack.env).stdout)
    for server in two_servers:
        if expected[server.endpoint]:
            assert status["endpoints"][server.endpoint]["prefix_cache"]["hit_rate"] > 0
