"""A stand-in for the GPU's forward pass, to measure the capture pipeline's own cost on CPU.

``--backend synthetic`` hands out real-size states (the model folder's ``config.json`` gives
layers, width and dtype; no weights are read) at a set rate of padded tokens per second, as an
asynchronous device would: a batch is "launched" at once and its states are ready when the
device would have finished it (one batch after another). The values are random, drawn once;
what the pipeline does with them (copies, encoding, writing, hashing, Redis) is the real work.
Default rate: one H200's forward pass of a Llama-3.1-8B-shaped target (bench/bench_capture.py).
"""

from __future__ import annotations

import threading
import time
from functools import partial

import torch

from capture.forward import States, row_states
from capture.model_config import ModelShape

H200_8B_TOKENS_PER_S = 34_000.0


class SyntheticTarget:
    """Random states of the model's shape, ready at ``rate`` padded tokens per second."""

    def __init__(self, model_dir: str, rate: float = H200_8B_TOKENS_PER_S) -> None:
        shape = ModelShape.read(model_dir)
        self.layers, self.hidden = shape.layers, shape.hidden
        self.dtype = getattr(torch, shape.dtype)
        self.rate = rate
        self._pool = torch.empty(0, dtype=self.dtype)
        self._free_at = 0.0  # when the stand-in device finishes its last batch
        self._lock = threading.Lock()

    def forward(self, batch: list[list[int]], aux: tuple[int, int, int]) -> list[States]:
        """Each row's states, ready once the device would have computed the padded batch."""
        longest = max(len(ids) for ids in batch)
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + longest * len(batch) / self.rate
            ready = partial(_until, self._free_at)
            pool = self._states(len(batch) * longest * 5)
        size = (len(batch), longest, self.hidden)
        joined = pool[: 4 * pool.numel() // 5].view(size[0], size[1], 4, size[2])
        post = pool[4 * pool.numel() // 5 :].view(size)
        return [
            row_states(joined[b, : len(ids)], post[b, : len(ids)], lambda: "", ready)
            for b, ids in enumerate(batch)
        ]

    def _states(self, vectors: int) -> torch.Tensor:
        need = vectors * self.hidden
        if self._pool.numel() < need:  # drawn once per size reached, then shared by batches
            self._pool = torch.randn(need, dtype=torch.float32).to(self.dtype)
        return self._pool[:need]

    def close(self) -> None:
        """Nothing runs in the background."""


def _until(deadline: float) -> None:
    pause = deadline - time.monotonic()
    if pause > 0:
        time.sleep(pause)  # the stand-in device is still computing this batch
