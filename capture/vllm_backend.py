"""The target's states from vLLM capture servers instead of a model loaded here.

What a vLLM (>= 0.18) server started with ``--speculative-config '{"method":
"extract_hidden_states", ...}'`` and the ``ExampleHiddenStatesConnector`` writes, as read in
vLLM's source:

- ``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``: a
  finished request's ``kv_transfer_params`` is ``{"hidden_states_path": FILE}``, FILE a
  safetensors file ``{"hidden_states": [n, k, H], "token_ids": [n]}`` (the prompt's ids). It is
  written after the response, on a thread, behind ``FILE.lock``: the writer holds an exclusive
  ``flock`` on it until the file is whole; the client removes both files when done.
- ``vllm/entrypoints/openai/completion/protocol.py``: ``CompletionResponse.kv_transfer_params``
  at the top level; with ``return_token_ids`` the choice's ``prompt_token_ids``.
- ``vllm/model_executor/models/extract_hidden_states.py`` and
  ``vllm/v1/spec_decode/extract_hidden_states.py``: ``k`` is the number of
  ``eagle_aux_hidden_state_layer_ids``; nothing else (no final layer) is added.
- ``vllm/model_executor/models/llama.py`` / ``qwen3.py`` via ``EagleModelMixin.
  _maybe_add_hidden_state`` (``interfaces.py``): id 0 is the embeddings, id ``i`` is
  ``hidden_states + residual`` after layer ``i - 1``, so id ``L`` is the last layer's output
  before the final norm: the ``hidden_states`` index space of ``capture/layers.py``. They are
  appended as the layers run, so the file's layer axis is in ascending id order, each id once,
  all before the final norm (SpecForge's normed final state is computed here, below).

So the servers must extract the run's aux indices and ``L``; ``EAGLEGEN_CAPTURE_SERVER_LAYERS``
says which ids they were started with when that is a superset, and a file with another layer
count, dtype, or other token ids is refused. The worker must see the server's files at the
path the server names (same node, or the same shared storage mounted at the same path), and
only in ``EAGLEGEN_CAPTURE_SERVER_DIR`` (``capture/server_files.py``): a server cannot make the
worker read or remove any other file.

Endpoints: each row goes to the next endpoint in turn with a free place under its configured
cap (``EAGLEGEN_MAX_INFLIGHT`` / ``EAGLEGEN_ENDPOINT_CAPS``), counted in this process only: not
the generation workers' Redis-wide caps or routing (a one-token prefill has no cache to route
by). An endpoint whose request failed in transport (refused, timed out, 5xx) is passed over
for ``EAGLEGEN_ENDPOINT_COOLDOWN`` seconds while another one is up, so a dead server does not
take every other row's attempt.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from capture import server_files
from capture.forward import States
from capture.model_config import ModelShape
from common import errors
from common.logs import secrets_of
from common.settings import Settings
from worker.chat import transport
from worker.chat.client import status_error, translate_errors

RESPONSE_BODY = 1 << 24  # a completion whose prompt ids are echoed: ~6 bytes a token


@dataclass(frozen=True)
class TargetConfig:
    """What the worker reads of the target's folder: layers, dtype, and its final norm."""

    layers: int
    hidden: int
    dtype: torch.dtype
    norm_weight: torch.Tensor
    eps: float

    @classmethod
    def read(cls, model_dir: str) -> TargetConfig:
        """From ``config.json`` and the safetensors holding ``model.norm.weight``."""
        shape = ModelShape.read(model_dir)
        dtype = getattr(torch, shape.dtype)
        weight = _norm_weight(Path(model_dir))
        return cls(shape.layers, shape.hidden, dtype, weight.to(dtype), shape.eps)

    def final_norm(self, pre: torch.Tensor) -> torch.Tensor:
        """The target's final RMSNorm as transformers' Llama/Qwen ``RMSNorm`` computes it
        (in float32, cast back before the weight); ``weight * x``, not Gemma's ``1 + w``."""
        x = pre.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm_weight * x.to(pre.dtype)


def _norm_weight(model_dir: Path) -> torch.Tensor:
    from safetensors import safe_open

    key = "model.norm.weight"
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        where = json.loads(index.read_text())["weight_map"].get(key)
        files = [model_dir / where] if where else []
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            if key in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                weight: torch.Tensor = f.get_tensor(key)
                return weight
    raise errors.ConfigError(f"{model_dir}: no {key} in its safetensors (the final norm)")


def server_layers(settings: Settings, aux: tuple[int, int, int], layers: int) -> list[int]:
    """The ids the servers extract, ascending (the file's layer order); checked to hold the
    run's aux indices and the last layer ``L`` (pre-norm final state)."""
    needed = sorted({*aux, layers})
    text = settings.capture_server_layers
    if not text:
        return needed
    try:
        given = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        msg = f"EAGLEGEN_CAPTURE_SERVER_LAYERS: not integers: {text!r}"
        raise errors.CaptureMismatch(msg) from None
    missing = [h for h in needed if h not in given]
    if missing:
        raise errors.CaptureMismatch(
            f"the capture servers extract layers {given} but this run needs {needed} "
            f"(missing {missing}): restart them with eagle_aux_hidden_state_layer_ids {needed}"
        )
    return given


class _Endpoints:
    """Round robin over the endpoints, each with at most its cap of rows in flight here."""

    def __init__(self, settings: Settings) -> None:
        self.urls = list(settings.endpoints)
        self.caps = {u: settings.cap_for(u) for u in self.urls}
        self.busy = dict.fromkeys(self.urls, 0)
        self.cooldown = settings.endpoint_cooldown
        self.down_until = dict.fromkeys(self.urls, 0.0)
        self._next = 0
        self._cond = threading.Condition()

    def failed(self, url: str) -> None:
        """Pass ``url`` over for the cool-down (unless every endpoint is down)."""
        with self._cond:
            self.down_until[url] = time.monotonic() + self.cooldown

    @contextmanager
    def borrow(self) -> Iterator[str]:
        with self._cond:
            url = self._free()
            while url is None:
                self._cond.wait()
                url = self._free()
            self.busy[url] += 1
        try:
            yield url
        finally:
            with self._cond:
                self.busy[url] -= 1
                self._cond.notify()

    def _free(self) -> str | None:
        now = time.monotonic()
        up = [u for u in self.urls if self.down_until[u] <= now] or self.urls
        for step in range(len(self.urls)):
            url = self.urls[(self._next + step) % len(self.urls)]
            if url in up and self.busy[url] < self.caps[url]:
                self._next = (self._next + step + 1) % len(self.urls)
                return url
        return None


class VllmForward:
    """``Forward`` (``capture/batcher.py``) answered by vLLM capture servers, row by row."""

    def __init__(self, settings: Settings, model_dir: str) -> None:
        self.settings = settings
        self.target = TargetConfig.read(model_dir)
        self.layers = self.target.layers
        self._endpoints = _Endpoints(settings)
        headers = {
            "Authorization": f"Bearer {settings.api_key_value()}",  # vLLM expects one, even unset
            "Content-Type": "application/json",
        }
        timeouts = (settings.connect_timeout, settings.stall_timeout)
        self._http = {
            url: transport.Connections(url, headers, *timeouts, max_idle=settings.concurrency)
            for url in settings.endpoints
        }
        self._models: dict[str, str] = {}
        self.folder = server_files.server_dir(settings.capture_server_dir)
        self._secrets = secrets_of(settings)

    def forward(self, batch: list[list[int]], aux: tuple[int, int, int]) -> list[States]:
        """Each row's states. The worker hands in one row at a time from each task thread
        (``capture.batcher.Unbatched``): the servers batch the requests themselves."""
        ids = server_layers(self.settings, aux, self.layers)
        return [self.row(row, aux, ids) for row in batch]

    def close(self) -> None:
        """Close the connections."""
        for conn in self._http.values():
            conn.close()

    def row(self, ids: list[int], aux: tuple[int, int, int], extracted: list[int]) -> States:
        """One row: request, check the path it names, wait for the file, read it, remove it,
        then check what it holds. A path outside the servers' folder is refused untouched."""
        with self._endpoints.borrow() as url:
            try:
                raw, echoed = self._request(url, ids)
            except (errors.ConnectError, errors.TimeoutError_, errors.ServerError):
                self._endpoints.failed(url)
                raise
        path = server_files.accepted(raw, self.folder, url)
        server_files.wait_unlocked(path, self.settings.capture_lock_timeout)
        content = server_files.read_bounded(path, self._most_bytes(len(ids), extracted), url)
        server_files.remove(path)  # read whole: this request's file, whatever it holds
        if echoed is not None and echoed != ids:
            raise errors.BadResponse(f"{url}: the server echoed other prompt ids than the row")
        return self._states(_decode(content, path, url), ids, aux, extracted, url)

    def _most_bytes(self, tokens: int, extracted: list[int]) -> int:
        """The largest file a row's states can take: [n, k, H] states and n int64 ids."""
        width = self.target.dtype.itemsize * len(extracted) * self.target.hidden
        return tokens * (width + 8) + server_files.HEADER_SLACK

    def _request(self, url: str, ids: list[int]) -> tuple[str, list[int] | None]:
        body = {
            "model": self._model(url), "prompt": ids, "max_tokens": 1, "temperature": 0.0,
            "return_token_ids": True,
        }  # fmt: skip
        conn, deadline = self._http[url], self.settings.max_request_time
        with translate_errors(url, self._secrets):
            status, content = conn.post(
                f"{url}/completions", json.dumps(body).encode(), deadline, RESPONSE_BODY
            )
            if status != 200:
                raise status_error(status, content, url, self._secrets)
            answer = json.loads(content)
        return _path_and_echo(answer, url)

    def _model(self, url: str) -> str:
        if self.settings.model:
            return self.settings.model
        if url not in self._models:
            with translate_errors(url, self._secrets):
                status, content = self._http[url].get(
                    f"{url}/models", self.settings.probe_timeout, 1 << 20
                )
                if status != 200:
                    raise status_error(status, content, url, self._secrets)
                self._models[url] = str(json.loads(content)["data"][0]["id"])
        return self._models[url]

    def _states(
        self, data: dict[str, torch.Tensor], ids: list[int], aux: tuple[int, int, int],
        extracted: list[int], url: str,
    ) -> States:  # fmt: skip
        hs, tokens = data.get("hidden_states"), data.get("token_ids")
        if hs is None or tokens is None:
            raise errors.BadResponse(f"{url}: the hidden-state file lacks hidden_states/token_ids")
        if tokens.tolist() != ids:
            raise errors.BadResponse(f"{url}: the hidden-state file holds other token ids")
        want = (len(ids), len(extracted), self.target.hidden)
        if tuple(hs.shape) != want:
            raise errors.CaptureMismatch(
                f"{url}: hidden_states {list(hs.shape)}, expected {list(want)} (tokens, layers "
                f"{extracted}, hidden): start the server with eagle_aux_hidden_state_layer_ids "
                f"{extracted} or set EAGLEGEN_CAPTURE_SERVER_LAYERS to its ids"
            )
        if hs.dtype != self.target.dtype:  # never cast: the trainer gets the model's own values
            raise errors.CaptureMismatch(
                f"{url}: hidden states in {hs.dtype}, the model is {self.target.dtype}: "
                "start the server with --dtype matching config.json"
            )
        where = {h: k for k, h in enumerate(extracted)}
        pre = hs[:, where[self.layers]].clone()
        picked = torch.stack([hs[:, where[h]] for h in aux], dim=1).clone()
        return States(picked, pre, self.target.final_norm(pre))


def _path_and_echo(answer: Any, url: str) -> tuple[str, list[int] | None]:
    """The file's path and the echoed prompt ids (None: not echoed; the file's are checked)."""
    if not isinstance(answer, dict):
        raise errors.BadResponse(f"{url}: the completion is not a JSON object")
    choices = answer.get("choices") or [{}]
    echoed = choices[0].get("prompt_token_ids") or answer.get("prompt_token_ids")
    params = answer.get("kv_transfer_params") or {}
    path = params.get("hidden_states_path") if isinstance(params, dict) else None
    if not isinstance(path, str) or not path:
        raise errors.BadResponse(
            f"{url}: no kv_transfer_params.hidden_states_path: is the server started with the "
            "extract_hidden_states speculative config and ExampleHiddenStatesConnector?"
        )
    return path, None if echoed is None else [int(i) for i in echoed]


def _decode(content: bytes, path: Path, url: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(content)
    except Exception as exc:  # a torn or foreign file: safetensors raises its own errors
        raise errors.BadResponse(f"{url}: {path} unreadable: {exc}") from None
