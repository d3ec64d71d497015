"""Worker CPU per request and per streamed token: the HTTP client, old against new, side by side.

    .venv/bin/python bench/bench_client.py [--requests 300] [--tokens 256] [--rounds 5]

Starts a zero-latency simulator that streams one token per chunk, as vLLM does, and measures
this process's CPU time (``time.process_time``; the simulator is another process):

* parser: one recorded stream of ``--tokens`` tokens parsed again and again from memory, by the
  old reader (httpx ``iter_lines``, ``json.loads`` with an attribute-dict hook, the old
  accumulator) and by :class:`worker.chat.stream.TurnStream`; once with one event per read (vLLM
  paced at its real speed) and once with the reads as they came off the socket;
* paced: ``--threads`` concurrent streams, the simulator pacing ``--pace`` seconds per token, so
  that every token arrives on its own (one read, one wake-up each), as from vLLM;
* requests: sequential requests through the old client (the openai SDK's request building and
  the old reader), through "httpx" (today's request and decoder, :class:`TurnStream`, on the
  httpx transport ChatClient had before worker/chat/transport.py) and through
  :class:`worker.chat.client.ChatClient` ("new": ``http.client`` keep-alive connections), with
  two-token answers (the per-request cost) and ``--tokens``-token answers (the per-token cost
  is the difference), each event in a read of its own; "coalesced": the same long answers with
  a 50 ms pause at the first read (the per-read check), so the rest of the answer waits in the
  socket and later socket reads carry many events, as under load; "httpx only" and "transport only"
  read the same responses through httpx or worker.chat.transport and parse nothing: the floor of
  each transport (httpx's HTTP/1.1 layer, h11, handles each event as one HTTP chunk;
  ``http.client`` reads one in a few C calls).

All clients alternate within each round, so machine noise hits them alike; figures are the
median over the rounds. The old clients are kept below as references: the SDK one as it was at
1b32beb, the httpx one as ChatClient._turn read before worker/chat/transport.py.
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
from worker.chat.client import ChatClient, chat_body
from worker.chat.reasoning import delta_reasoning
from worker.chat.stream import TurnStream
from worker.chat.transport import Connections

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
            **params.sampling(), "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        raw = self._client.chat.completions.with_streaming_response.create(**request)
        with raw as response:
            acc = old_read(response)
        assert acc.finish_reason is not None
        return int(acc.usage[1])

    def close(self) -> None:
        self._client.close()


class HttpxClient:
    """ChatClient's request path on httpx, as before worker/chat/transport.py: same body, same
    decoder, httpx's stream read raw to its end (one keep-alive connection)."""

    def __init__(self, endpoint: str, model: str) -> None:
        self.model = model
        self.url = f"{endpoint}/chat/completions"
        headers = {"Authorization": "Bearer EMPTY", "Content-Type": "application/json"}
        self._http = httpx.Client(headers=headers)

    def complete(
        self, messages: list[dict[str, Any]], params: GenParams, check: Check | None = None
    ) -> int:
        body = chat_body(self.model, messages, params, True)
        stream = TurnStream("bench")
        with self._http.stream("POST", self.url, content=body) as response:
            for data in response.iter_raw():
                stream.feed(data)
                if check is not None:
                    check()
        return stream.result(0.0, self.model).usage.completion_tokens

    def close(self) -> None:
        self._http.close()


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


Check = Callable[[], None]
Complete = Callable[[list[dict[str, Any]], GenParams, Check | None], int]


def pause_once() -> Check:
    """A per-read check that waits 50 ms once: what follows piles up, later reads coalesce."""
    paused: list[bool] = []

    def check() -> None:
        if not paused:
            paused.append(True)
            time.sleep(0.05)

    return check


def clients(endpoint: str, model: str, threads: int) -> tuple[dict[str, Complete], list[Any]]:
    """The clients to compare, each a call returning the completion tokens."""
    settings = Settings(endpoints=[endpoint], model=model, concurrency=threads)
    new = ChatClient(endpoint, settings)
    text = ChatClient(endpoint, settings.model_copy(update={"token_ids": "off"}))
    old, on_httpx = OldClient(endpoint, model), HttpxClient(endpoint, model)
    raw = httpx.Client()
    conns = Connections(endpoint, {"Content-Type": "application/json"}, 10, 60, threads)
    url = f"{endpoint}/chat/completions"

    def count(reads: Iterable[bytes], check: Check | None) -> int:
        events = 0
        for data in reads:
            events += data.count(b"data: ")
            if check is not None:
                check()
        return events - 4  # less the role, finish, usage and [DONE] events: the tokens

    def httpx_only(messages: list[dict[str, Any]], params: GenParams, check: Check | None) -> int:
        """The bytes read through httpx and nothing parsed: the floor under any parser."""
        body = chat_body(model, messages, params, True)
        with raw.stream("POST", url, content=body) as response:
            return count(response.iter_raw(), check)

    def transport_only(
        messages: list[dict[str, Any]], params: GenParams, check: Check | None
    ) -> int:
        """The same through worker.chat.transport (http.client)."""
        body = chat_body(model, messages, params, True)
        with conns.stream("POST", url, content=body) as response:
            return count(response.iter_raw(), check)

    calls: dict[str, Complete] = {
        "old": lambda m, p, c: old.complete(m, p),  # no per-read hook: never coalesced here
        "httpx": on_httpx.complete,
        "new": lambda m, p, c: new.complete(m, p, c).usage.completion_tokens,
        "new, ids off": lambda m, p, c: text.complete(m, p, c).usage.completion_tokens,
        "httpx only": httpx_only,
        "transport only": transport_only,
    }
    return calls, [old, on_httpx, new, text, raw, conns]


def request_rows(endpoint: str, model: str, rounds: int, requests: int) -> list[str]:
    calls, closers = clients(endpoint, model, 1)
    long = GenParams(max_tokens=1000)
    # shape: (params, the per-read check's factory)
    shapes: dict[str, tuple[GenParams, Callable[[], Check | None]]] = {
        "short": (GenParams(max_tokens=2), lambda: None),
        "long": (long, lambda: None),
        "coalesced": (long, pause_once),
    }
    per: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], int] = {}
    try:
        for _ in range(rounds):
            for shape, (params, check) in shapes.items():
                messages = [{"role": "user", "content": f"bench {shape}"}]
                n = requests if shape == "short" else max(requests // 10, 3)
                for side, complete in calls.items():
                    if shape == "coalesced" and side == "old":
                        continue
                    tokens[(shape, side)] = complete(messages, params, check())
                    work = lambda c=complete, m=messages, p=params, k=check: c(m, p, k())  # noqa: E731
                    per.setdefault((shape, side), []).append(cpu(work, n) / n)
    finally:
        for client in closers:
            client.close()
    med = {k: statistics.median(v) for k, v in per.items()}
    rows, figures = [], {}
    for side in calls:
        extra = tokens[("long", side)] - tokens[("short", side)]
        per_token = (med[("long", side)] - med[("short", side)]) / extra
        together = (med.get(("coalesced", side), 0.0) - med[("short", side)]) / extra
        figures[side] = (med[("short", side)], per_token, together)
        rows.append(
            f"requests {side:14s}: {med[('short', side)] * 1e3:.3f} ms CPU per request "
            f"({tokens[('short', side)]}-token answers), {per_token * 1e6:.1f} us per extra "
            f"streamed token ({tokens[('long', side)]}-token answers)"
            + (f", coalesced {together * 1e6:.1f} us" if side != "old" else "")
        )
    for side in ("httpx", "new", "new, ids off", "httpx only", "transport only"):
        request, token = (figures[side][i] / figures["old"][i] for i in (0, 1))
        rows.append(f"requests {side}/old: per request {request:.2f}, per token {token:.2f}")
    request, token, together = (figures["new"][i] / figures["httpx"][i] for i in (0, 1, 2))
    rows.append(
        f"requests new/httpx: per request {request:.2f}, per token {token:.2f}, "
        f"coalesced per token {together:.2f}"
    )
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
                    tokens = sum(pool.map(lambda m, c=complete: c(m, params, None), asks))
                    per.setdefault(side, []).append((time.process_time() - start) / tokens)
    finally:
        for client in closers:
            client.close()
    med = {side: statistics.median(v) for side, v in per.items()}
    rows = [f"paced {side:14s}: {med[side] * 1e6:.1f} us CPU per token" for side in med]
    for side in ("httpx", "new", "new, ids off", "httpx only", "transport only"):
        rows.append(f"paced {side}/old: {med[side] / med['old']:.2f}")
    rows.append(f"paced new/httpx: {med['new'] / med['httpx']:.2f}")
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
