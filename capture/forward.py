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

# The slot of the last layer's output before the norm, after the three aux layers.
PRE = 3


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
    joined: torch.Tensor | None = None  # [seq, 4, H]: aux, then pre_norm, in one block

    def aux_and_pre(self) -> torch.Tensor:
        """[seq, 4, H]: the three aux states and the last layer's before the norm."""
        if self.joined is not None and self.joined.is_contiguous():
            return self.joined
        return torch.cat([self.aux, self.pre_norm.unsqueeze(1)], dim=1)

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
            joined, post = self._stacked(ids, aux)
            flags = _problems(joined, post, lengths)
            ready = None
            if self._copies is not None:
                (joined, post, flags), ready = self._copies.to_host(joined, post, flags)
        return [
            row_states(joined[b, :n], post[b, :n], partial(_flag, flags, b), ready)
            for b, n in enumerate(lengths)
        ]

    def _stacked(
        self, ids: torch.Tensor, aux: tuple[int, int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[batch, seq, 4, H]: the aux layers and the last before the norm (speculators' own
        order, so its tensor is one block of memory per row); [batch, seq, H] after it."""
        if ids.device != self.device:
            ids = ids.pin_memory().to(self.device, non_blocking=True)
        out = self._decoder(input_ids=ids, output_hidden_states=True, use_cache=False)
        pre, post = self._norm_io.pop("pre"), self._norm_io.pop("post")
        picked = [pre if h == self.layers else out.hidden_states[h] for h in aux]
        return torch.stack([*picked, pre], dim=2), post


def row_states(
    joined: torch.Tensor, post: torch.Tensor, checked: Callable[[], str] | None = None,
    ready: Callable[[], None] | None = None,
) -> States:  # fmt: skip
    """A row's states as views of its batch's buffers: each layout copies what it writes."""
    return States(joined[:, :PRE], joined[:, PRE], post, checked, ready, joined)


# What the device-side check found, by the code it returns (0: nothing).
_PROBLEMS = ("", NON_FINITE, "a layer of a token is constant across the hidden dimension")


def _problems(joined: torch.Tensor, post: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Per row, 0 or the index of the first problem in ``_PROBLEMS``; on the device, so no
    value of the batch is scanned on the host."""
    device = joined.device
    # [batch, seq]: the rows' own tokens, not the padding.
    real = (
        torch.arange(joined.shape[1], device=device)[None, :]
        < torch.tensor(lengths, device=device)[:, None]
    )
    bad = (~torch.isfinite(joined)).flatten(2).any(dim=2) | (~torch.isfinite(post)).any(dim=2)
    aux = joined[:, :, :PRE]
    flat = (aux.amax(dim=3) == aux.amin(dim=3)).any(dim=2)
    bad_row, flat_row = (bad & real).any(dim=1), (flat & real).any(dim=1)
    return torch.where(bad_row, 1, torch.where(flat_row, 2, 0)).to(torch.int8)


def _flag(flags: torch.Tensor, b: int) -> str:
    return _PROBLEMS[int(flags[b])]


class _Copier:
    """Copies a batch's states to pinned host memory on a stream of its own, so the next
    forward pass starts at once; the rows wait for the copy's event in their own threads."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def to_host(
        self, *tensors: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        self.stream.wait_stream(torch.cuda.current_stream(tensors[0].device))
        with torch.cuda.stream(self.stream):
            # The caching host allocator reuses pinned blocks once their copies are done.
            host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
            for mine, theirs in zip(host, tensors, strict=True):
                mine.copy_(theirs, non_blocking=True)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        for t in tensors:  # allocated on the device until the copy stream is done with them
            t.record_stream(self.stream)
        return host, done.synchronize
