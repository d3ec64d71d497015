"""Probes sent alike to a real vLLM server and to the simulator, and the shapes they answer.

A shape is a JSON value with every scalar replaced by its type's name and every list by the
shape of its first element: what EagleGen's decoder depends on (which fields, of which type,
in which chunk), not the model's text. ``differences`` names each field where two shapes part.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import httpx

from worker.endpoints.adaptive import KV_USAGE, RUNNING, WAITING
from worker.endpoints.server_cache import HITS, QUERIES

TIMEOUT = 120.0  # a 2-core machine may queue a request that long
USER = [{"role": "user", "content": "Say something."}]
# Every /metrics family EagleGen reads (either of KV_USAGE's names will do).
METRICS = (RUNNING, WAITING, QUERIES, HITS)


def shape(value: Any) -> Any:
    """``value`` with scalars as their types' names and lists as their first item's shape."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def differences(vllm: Any, sim: Any, path: str = "") -> list[str]:
    """Where the simulator's shape differs from vLLM's, each named by its field's path."""
    if isinstance(vllm, dict) and isinstance(sim, dict):
        found = [f"{path}.{k}: sent by vLLM only" for k in vllm.keys() - sim.keys()]
        found += [f"{path}.{k}: sent by the simulator only" for k in sim.keys() - vllm.keys()]
        for key in sorted(vllm.keys() & sim.keys()):
            found += differences(vllm[key], sim[key], f"{path}.{key}")
        return found
    if isinstance(vllm, list) and isinstance(sim, list):
        return differences(vllm[0], sim[0], f"{path}[0]") if vllm and sim else []
    if vllm != sim:
        return [f"{path}: vLLM {_kind(vllm)}, the simulator {_kind(sim)}"]
    return []


def _kind(found: Any) -> str:
    return (
        "an object" if isinstance(found, dict) else "a list" if isinstance(found, list) else found
    )


class Probe:
    """One server (its base URL, without ``/v1``) and the model it serves."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=TIMEOUT)
        self.model = self.models()["data"][0]["id"]

    def close(self) -> None:
        self.http.close()

    def models(self) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get(f"{self.url}/v1/models").json()
        return found

    def error(self, body: dict[str, Any]) -> tuple[int, Any]:
        """The status and the body's shape of a chat request the server refuses."""
        answer = self.http.post(f"{self.url}/v1/chat/completions", json=body)
        return answer.status_code, shape(answer.json())

    def metrics(self) -> dict[str, str]:
        """The type of each /metrics family EagleGen reads that the server exposes."""
        text = self.http.get(f"{self.url}/metrics").text
        kinds = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
        wanted = (*METRICS, *KV_USAGE)
        return {name: kind for name, kind in kinds.items() if name in wanted}

    def chat(self, max_tokens: int, **more: Any) -> list[dict[str, Any] | str]:
        """A streamed chat completion as EagleGen asks for one: its events, [DONE] included."""
        body = {"model": self.model, "messages": USER, "max_tokens": max_tokens, **_STREAM,
                **more}  # fmt: skip
        return self.stream("/v1/chat/completions", body)

    def completion(self, prompt: list[int], max_tokens: int) -> list[dict[str, Any] | str]:
        """A streamed /v1/completions continuing a token-id prompt (EagleGen's exact resume)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, **_STREAM}
        return self.stream("/v1/completions", body)

    def stream(
        self, route: str, body: dict[str, Any], abort_after: int | None = None
    ) -> list[dict[str, Any] | str]:
        """The events of a streamed request; with ``abort_after``, the request is aborted on
        the server (by its chunk id) once that many chunks arrived, and read to its end."""
        events: list[dict[str, Any] | str] = []
        headers = {"X-Request-Id": uuid.uuid4().hex}
        with self.http.stream("POST", self.url + route, json=body, headers=headers) as answer:
            assert answer.status_code == 200, answer.read()
            for line in answer.iter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line.removeprefix("data: ")
                events.append(payload if payload == "[DONE]" else json.loads(payload))
                if len(events) == abort_after:
                    self._abort(str(events[-1]["id"]))  # type: ignore[index]
        return events

    def aborted_chat(self, after: int, **more: Any) -> list[dict[str, Any] | str]:
        """A long streamed chat answer aborted after ``after`` chunks (the reconciler's abort)."""
        body = {"model": self.model, "messages": USER, "max_tokens": 2000, "ignore_eos": True,
                **_STREAM, **more}  # fmt: skip
        return self.stream("/v1/chat/completions", body, abort_after=after)

    def _abort(self, server_id: str) -> None:
        # From another thread, as the reconciler's abort comes from another process: the
        # stream's reader must not wait on it.
        def send() -> None:
            route = f"{self.url}/inference/v1/abort_requests"
            httpx.post(route, json={"request_ids": [server_id]}, timeout=TIMEOUT)

        threading.Thread(target=send, daemon=True).start()


_STREAM = {"stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}


def chunk_kinds(events: list[dict[str, Any] | str]) -> dict[str, Any]:
    """The shape of the first chunk of each kind a chat or text stream holds: ``opening``
    (the first), ``reasoning``, ``content``, ``text``, ``finish`` (its last choice's
    finish_reason set), ``usage`` (no choices); ``end``: the last event as sent."""
    kinds: dict[str, Any] = {"opening": shape(events[0]), "end": events[-1]}
    for event in events[1:-1]:
        assert isinstance(event, dict), event
        kinds.setdefault(_kind_of(event), shape(event))
    return kinds


def _kind_of(event: dict[str, Any]) -> str:
    if not event.get("choices"):
        return "usage" if "usage" in event else "empty"
    choice = event["choices"][0]
    if choice.get("finish_reason") is not None:
        return "finish"
    delta = choice.get("delta") or {}
    for field in ("reasoning", "content", "tool_calls"):
        if delta.get(field):
            return field
    return "text" if choice.get("text") else "other"


def finish_reasons(events: list[dict[str, Any] | str]) -> list[str]:
    """The finish reasons a stream sent, in order."""
    return [c["finish_reason"] for e in events if isinstance(e, dict)
            for c in e.get("choices", []) if c.get("finish_reason")]  # fmt: skip
