"""The target's forward pass: every hidden state a layout needs, for a batch of rows.

The model is loaded once per process in its own dtype (a float32 model gives float32 states,
bf16 gives bf16: nothing is cast), straight onto its device (no copy of the weights in host
memory). Rows are right-padded into one batch and run without an attention mask: a causal
model's states of real tokens do not see the padding after them, and a mask would make
transformers read a device value each pass (the next launch then waits for the last to end).
transformers' ``output_hidden_states`` gives the embeddings and each layer's output; its last
entry is after the final norm in some versions and not in others, so the last layer's output
before the norm and the normed one are both taken from hooks on the final norm itself.

On a GPU the states of a batch travel to pinned host memory on a stream of their own while the
next batch computes; each row's states wait for that copy (``States.wait``) in the row's own
thread, and the checks that need every value (finite, no dead layer) run on the device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

# Slots of the stacked states: three aux layers, the last layer before and after the norm.
PRE, POST = 3, 4


@dataclass(frozen=True)
class States:
    """One row's states: ``aux`` [seq, 3, H], the final layer's output before the norm
    ``pre_norm`` [seq, H] and after it ``post_norm`` [seq, H].

    ``checked``: what the forward pass's own check found, once the values are there (""
    nothing; None: not checked there); ``ready``: waits until the tensors hold their values
    (a copy from the GPU in flight)."""

    aux: torch.Tensor
    pre_norm: torch.Tensor
    post_norm: torch.Tensor
    checked: Callable[[], str] | None = None
    ready: Callable[[], None] | None = None

    def wait(self) -> None:
        """Block until the tensors hold their values."""
        if self.ready is not None:
            self.ready()

    def problem(self) -> str | None:
        """What the forward pass's check found ("" nothing; None: no check ran there)."""
        self.wait()
        return None if self.checked is None else self.checked()

    def finite(self) -> bool:
        """False when any value is NaN or inf."""
        found = self.problem()
        if found is not None:
            return found != NON_FINITE
        return all(bool(torch.isfinite(t).all()) for t in (self.aux, self.pre_norm, self.post_norm))


NON_FINITE = "non-finite"


class TargetModel:
    """A causal LM loaded once; ``forward`` is serialised (one batch at a time per process)."""

    def __init__(self, model_dir: str, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        place: dict[str, Any] = {} if self.device.type == "cpu" else {"device_map": device}
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", **place)
        self.model: Any = model.eval()  # type: ignore[no-untyped-call]
        config = model.config
        self.layers = int(config.num_hidden_layers)
        self.hidden = int(config.hidden_size)
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self.pad_id = int(getattr(config, "pad_token_id", None) or 0)
        self._decoder: Any = model.get_decoder()  # type: ignore[no-untyped-call]
        self._norm_io: dict[str, torch.Tensor] = {}
        self._decoder.norm.register_forward_hook(self._keep_norm_io)
        self._lock = threading.Lock()
        self._copies = _Copier(self.device) if self.device.type == "cuda" else None

    def _keep_norm_io(self, _module: Any, args: tuple[torch.Tensor, ...], out: Any) -> None:
        self._norm_io["pre"] = args[0]
        self._norm_io["post"] = out

    def close(self) -> None:
        """Nothing to let go of: the model goes with the process."""

    @torch.inference_mode()
    def forward(self, batch: list[list[int]], aux: tuple[int, int, int]) -> list[States]:
        """States of each row of ``batch`` (token ids); ``aux``: ``hidden_states`` indices."""
        lengths = [len(row) for row in batch]
        ids = torch.full((len(batch), max(lengths)), self.pad_id, dtype=torch.long)
        for b, row in enumerate(batch):
            ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        with self._lock:
            stacked = self._stacked(ids, aux)  # [batch, seq, 5, H]
            flags = _problems(stacked, lengths)
            ready = None
            if self._copies is not None:
                stacked, flags, ready = self._copies.to_host(stacked, flags)
        return [
            States(*_slots(stacked[b, :n]), checked=partial(_flag, flags, b), ready=ready)
            for b, n in enumerate(lengths)
        ]

    def _stacked(self, ids: torch.Tensor, aux: tuple[int, int, int]) -> torch.Tensor:
        if ids.device != self.device:
            ids = ids.pin_memory().to(self.device, non_blocking=True)
        out = self._decoder(input_ids=ids, output_hidden_states=True, use_cache=False)
        pre, post = self._norm_io.pop("pre"), self._norm_io.pop("post")
        picked = [pre if h == self.layers else out.hidden_states[h] for h in aux]
        return torch.stack([*picked, pre, post], dim=2)


def _slots(row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Views of the batch's buffer: each layout copies what it writes, so no copy here.
    return row[:, :PRE], row[:, PRE], row[:, POST]


# What the device-side check found, by the code it returns (0: nothing).
_PROBLEMS = ("", NON_FINITE, "a layer of a token is constant across the hidden dimension")


def _problems(stacked: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Per row, 0 or the index of the first problem in ``_PROBLEMS``; on the device, so no
    value of the batch is scanned on the host."""
    seq = stacked.shape[1]
    real = (
        torch.arange(seq, device=stacked.device)[None, :]
        < torch.tensor(lengths, device=stacked.device)[:, None]
    )  # [batch, seq]: the rows' own tokens, not the padding
    bad = (~torch.isfinite(stacked)).flatten(2).any(dim=2) & real
    aux = stacked[:, :, :PRE]
    flat = (aux.amax(dim=3) == aux.amin(dim=3)).any(dim=2) & real
    return torch.where(bad.any(dim=1), 1, torch.where(flat.any(dim=1), 2, 0)).to(torch.int8)


def _flag(flags: torch.Tensor, b: int) -> str:
    return _PROBLEMS[int(flags[b])]


class _Copier:
    """Copies a batch's states to pinned host memory on a stream of its own, so the next
    forward pass starts at once; the rows wait for the copy's event in their own threads."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def to_host(
        self, stacked: torch.Tensor, problems: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Callable[[], None]]:
        self.stream.wait_stream(torch.cuda.current_stream(stacked.device))
        with torch.cuda.stream(self.stream):
            # The caching host allocator reuses pinned blocks once their copies are done.
            host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            flags = torch.empty(problems.shape, dtype=problems.dtype, pin_memory=True)
            host.copy_(stacked, non_blocking=True)
            flags.copy_(problems, non_blocking=True)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        # The device buffers stay allocated until the copy stream is done with them.
        stacked.record_stream(self.stream)
        problems.record_stream(self.stream)
        return host, flags, done.synchronize
