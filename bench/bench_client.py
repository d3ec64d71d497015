"""Worker CPU per request and per streamed token: the HTTP client, old against new, side by side.

    .venv/bin/python bench/bench_client.py [--requests 300] [--tokens 256] [--rounds 5]

Starts a zero-latency simulator that streams one token per chunk, as vLLM does, and measures
this process's CPU time (``time.process_time``; the simulator is another process):

* parser: one recorded stream of ``--tokens`` tokens parsed again and again from memory, by the
  old reader (httpx ``iter_lines``, ``json.loads`` with an attribute-dict hook, the old
  accumulator) and by :class:`worker.client.TurnStream`; once with one event per read (vLLM
  paced at its real speed) and once with the reads as they came off the socket;
* paced: ``--threads`` concurrent streams, the simulator pacing ``--pace`` seconds per token, so
  that every token arrives on its own (one read, one wake-up each), as from vLLM;
* requests: sequential requests through the old client (the openai SDK's request building and
  the old reader) and through :class:`worker.client.ChatClient`, with one-token answers (the
  per-request cost) and ``--tokens``-token answers (the per-token cost is the difference);
  "httpx only" reads the same responses through httpx and parses nothing, the floor under
  any parser (httpx's HTTP/1.1 layer, h11, handles each event as one HTTP chunk).

Old and new alternate within each round, so machine noise hits both alike; figures are the
median over the rounds. The old client is kept below as a reference, as it was at 1b32beb.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2 as httpx
import openai

from common.models import GenParams
from common.settings import Settings
from tests.harness import Procs, start_simulator
from worker.client import ChatClient, TurnStream, chat_body
from worker.reasoning import delta_reasoning

# --- the old client, as a reference ------------------------------------------------------


class _Fields(dict[str, Any]):
    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def old_chunks(lines: Iterable[str]) -> Iterator[Any]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data, object_hook=_Fields)


class OldAccumulator:
    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.text_chunks = 0

    def add(self, chunk: Any) -> None:
        if chunk.usage is not None:
            self.usage = (chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is not None:
                self.content.append(delta.content or "")
                piece = delta_reasoning(delta)
                if piece:
                    self.reasoning.append(piece)
                self.text_chunks += bool(delta.content or piece)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason


def old_read(response: Any) -> OldAccumulator:
    acc = OldAccumulator()
    lines = response.iter_lines()
    for chunk in old_chunks(lines):
        acc.add(chunk)
    for _ in lines:
        pass
    return acc


class OldClient:
    """The request path of the old ChatClient: openai SDK request, httpx lines, old parser."""

    def __init__(self, endpoint: str, model: str) -> None:
        self.model = model
        self._client = openai.OpenAI(
            base_url=endpoint, api_key="EMPTY", max_retries=0, http_client=httpx.Client()
        )

    def complete(self, messages: list[dict[str, Any]], params: GenParams) -> int:
        request = {
            "model": self.model, "messages": messages, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        raw = self._client.chat.completions.with_streaming_response.create(**request)
        with raw as response:
            acc = old_read(response)
        assert acc.finish_reason is not None
        return int(acc.usage[1])

    def close(self) -> None:
        self._client.close()


# --- the measurements --------------------------------------------------------------------


def cpu(work: Callable[[], Any], repeat: int) -> float:
    """CPU seconds of this process for ``repeat`` calls of ``work``."""
    start = time.process_time()
    for _ in range(repeat):
        work()
    return time.process_time() - start


def record(endpoint: str, model: str, body: dict[str, Any]) -> list[bytes]:
    """The reads of one streamed response, as they came off the socket."""
    payload = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **body}
    with (
        httpx.Client() as client,
        client.stream("POST", f"{endpoint}/chat/completions", json=payload) as response,
    ):
        return list(response.iter_raw())


def events(reads: list[bytes], per_read: int = 1) -> list[bytes]:
    """The same stream with ``per_read`` events per read."""
    split = [e + b"\n\n" for e in b"".join(reads).split(b"\n\n") if e]
    return [b"".join(split[i : i + per_read]) for i in range(0, len(split), per_read)]


def parse_old(reads: list[bytes]) -> None:
    old_read(httpx.Response(200, content=iter(reads)))


def parse_new(reads: list[bytes]) -> None:
    stream = TurnStream("bench")
    for data in httpx.Response(200, content=iter(reads)).iter_bytes():
        stream.feed(data)
    assert stream.finish_reason is not None


def parser_rows(endpoint: str, model: str, rounds: int, repeat: int) -> list[str]:
    rows = []
    ask = {"messages": [{"role": "user", "content": "parse me"}], "return_token_ids": True}
    for label, body in (("with ids", ask), ("text only", {"messages": ask["messages"]})):
        reads = record(endpoint, model, body)
        tokens = sum(e.count(b'"delta"') for e in events(reads)) - 1  # less the role chunk
        for shape, pieces in (("1 event/read", events(reads)), ("16/read", events(reads, 16))):
            old, new = [], []
            for _ in range(rounds):
                old.append(cpu(lambda p=pieces: parse_old(p), repeat) / repeat / tokens * 1e6)
                new.append(cpu(lambda p=pieces: parse_new(p), repeat) / repeat / tokens * 1e6)
            o, n = statistics.median(old), statistics.median(new)
            rows.append(
                f"parser {label:9s} {shape:12s} ({tokens} tokens): "
                f"old {o:5.1f} us/token  new {n:5.1f} us/token  new/old {n / o:.2f}"
            )
    return rows


Complete = Callable[[list[dict[str, Any]], GenParams], int]


def clients(endpoint: str, model: str, threads: int) -> tuple[dict[str, Complete], list[Any]]:
    """The three clients to compare, each a call returning the completion tokens."""
    settings = Settings(endpoints=[endpoint], model=model, concurrency=threads)
    new = ChatClient(endpoint, settings)
    text = ChatClient(endpoint, settings.model_copy(update={"token_ids": "off"}))
    old = OldClient(endpoint, model)
    raw = httpx.Client()

    def transport(messages: list[dict[str, Any]], params: GenParams) -> int:
        """The bytes read through httpx and nothing parsed: the floor under any parser."""
        body = chat_body(model, messages, params, True)
        with raw.stream("POST", f"{endpoint}/chat/completions", content=body) as response:
            events = sum(data.count(b"data: ") for data in response.iter_raw())
        return events - 4  # less the role, finish, usage and [DONE] events: the tokens

    calls: dict[str, Complete] = {
        "old": old.complete,
        "new": lambda m, p: new.complete(m, p).usage.completion_tokens,
        "new, ids off": lambda m, p: text.complete(m, p).usage.completion_tokens,
        "httpx only": transport,
    }
    return calls, [old, new, text, raw]


def request_rows(endpoint: str, model: str, rounds: int, requests: int) -> list[str]:
    calls, closers = clients(endpoint, model, 1)
    shapes = {"short": GenParams(max_tokens=2), "long": GenParams(max_tokens=1000)}
    per: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], int] = {}
    try:
        for _ in range(rounds):
            for shape, params in shapes.items():
                messages = [{"role": "user", "content": f"bench {shape}"}]
                n = requests if shape == "short" else max(requests // 10, 3)
                for side, complete in calls.items():
                    tokens[(shape, side)] = complete(messages, params)
                    seconds = cpu(lambda c=complete, m=messages, p=params: c(m, p), n) / n
                    per.setdefault((shape, side), []).append(seconds)
    finally:
        for client in closers:
            client.close()
    med = {k: statistics.median(v) for k, v in per.items()}
    rows, figures = [], {}
    for side in calls:
        extra = tokens[("long", side)] - tokens[("short", side)]
        per_token = (med[("long", side)] - med[("short", side)]) / extra
        figures[side] = (med[("short", side)], per_token)
        rows.append(
            f"requests {side:13s}: {med[('short', side)] * 1e3:.3f} ms CPU per request "
            f"({tokens[('short', side)]}-token answers), {per_token * 1e6:.1f} us per extra "
            f"streamed token ({tokens[('long', side)]}-token answers)"
        )
    for side in ("new", "new, ids off", "httpx only"):
        request, token = (figures[side][i] / figures["old"][i] for i in (0, 1))
        rows.append(f"requests {side}/old: per request {request:.2f}, per token {token:.2f}")
    return rows


def paced_rows(endpoint: str, model: str, rounds: int, threads: int) -> list[str]:
    """CPU per token when every token arrives on its own, as from vLLM at its real pace."""
    calls, closers = clients(endpoint, model, threads)
    params = GenParams(max_tokens=1000)
    per: dict[str, list[float]] = {}
    try:
        with ThreadPoolExecutor(threads) as pool:
            for r in range(rounds):
                for side, complete in calls.items():
                    asks = [[{"role": "user", "content": f"paced {r} {i}"}] for i in range(threads)]
                    start = time.process_time()
                    tokens = sum(pool.map(lambda m, c=complete: c(m, params), asks))
                    per.setdefault(side, []).append((time.process_time() - start) / tokens)
    finally:
        for client in closers:
            client.close()
    med = {side: statistics.median(v) for side, v in per.items()}
    rows = [f"paced {side:13s}: {med[side] * 1e6:.1f} us CPU per token" for side in med]
    for side in ("new", "new, ids off", "httpx only"):
        rows.append(f"paced {side}/old: {med[side] / med['old']:.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pace", type=float, default=0.002, help="seconds per token, paced")
    a = parser.parse_args()
    answer = ["--min-answer-tokens", str(a.tokens), "--max-answer-tokens", str(a.tokens)]
    sim_options = ["--time-per-token", "0.000001", "--reasoning-tokens", "0", *answer]
    with tempfile.TemporaryDirectory() as tmp, Procs(Path(tmp)) as procs:
        sim = start_simulator(procs, *sim_options)
        model = httpx.get(f"{sim.endpoint}/models").json()["data"][0]["id"]
        rows = parser_rows(sim.endpoint, model, a.rounds, a.repeat)
        rows += request_rows(sim.endpoint, model, a.rounds, a.requests)
        sim.configure(time_per_token=a.pace)
        rows += paced_rows(sim.endpoint, model, a.rounds, a.threads)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
