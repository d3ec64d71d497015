"""A second, independent forward pass of the target, for ``capture verify``'s sample.

Not capture's code path (``capture/forward.py`` batches rows with padding and reads
``output_hidden_states``): here each row runs alone, unpadded, and the states are taken by
hooks on the decoder layers themselves and on the final norm. A wrong layer index, a slot
order, a batch row mixed with another (speculators #279) or a pre/post-norm swap in capture
shows as a difference between the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from capture.forward import States

# How far a correct capture's states may be from the recompute's, as a relative L2 error over
# the row (one slot, all tokens): another batch, padding, kernel or device rounds differently,
# more so the deeper the layer. Measured (bench/bench_verify.py, docs/capture.md): bf16 at
# Llama-3.1-8B's shape on an H200, a batched capture against each row alone, up to 5.1% on a
# single token of the last layer; a layer off by one, tens of percent over the row. One token
# may be off by TOKEN_FACTOR times as much (a whole row's error averages its tokens).
TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
TOKEN_FACTOR = 4


class Recompute:
    """The target loaded apart from the capture worker, run one row at a time."""

    def __init__(self, model_dir: str, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        self.model: Any = model.eval().to(device)  # type: ignore[no-untyped-call]
        self.device = torch.device(device)
        self.layers = int(model.config.num_hidden_layers)
        self.dtype: torch.dtype = next(model.parameters()).dtype
        # The decoder alone: the LM head's logits (seq x vocab) are not needed.
        self._decoder: Any = model.get_decoder()  # type: ignore[no-untyped-call]
        decoder = self._decoder
        self._seen: dict[str, torch.Tensor] = {}
        self._wanted: set[int] = set()
        for i, layer in enumerate(decoder.layers):
            layer.register_forward_hook(self._keep_layer(i))
        decoder.norm.register_forward_hook(self._keep_norm)

    def _keep_layer(self, i: int) -> Any:
        def hook(_module: Any, _args: Any, out: Any) -> None:
            if i in self._wanted:  # only the run's layers are kept (a long row, a big model)
                self._seen[f"layer{i}"] = out[0] if isinstance(out, tuple) else out

        return hook

    def _keep_norm(self, _module: Any, args: tuple[torch.Tensor, ...], out: Any) -> None:
        self._seen["pre"], self._seen["post"] = args[0], out

    @torch.inference_mode()
    def states(self, ids: list[int], aux: tuple[int, int, int]) -> States:
        """One row's states; ``aux`` as ``hidden_states`` indices (``h``: output of layer
        ``h - 1``; ``h = L``: the last layer's output, the norm's input)."""
        self._wanted = {h - 1 for h in aux}
        self._decoder(input_ids=torch.tensor([ids], device=self.device), use_cache=False)
        seen, self._seen = self._seen, {}
        pre, post = seen["pre"][0], seen["post"][0]
        picked = [pre if h == self.layers else seen[f"layer{h - 1}"][0] for h in aux]
        return States(torch.stack(picked, dim=1).cpu(), pre.cpu(), post.cpu())


@dataclass(frozen=True)
class Difference:
    """A captured slot against its recompute: relative L2 errors over the row and at its
    worst token."""

    row: float
    token: float
    at: int

    def within(self, tolerance: float) -> bool:
        """Both errors inside the tolerance (False for NaN)."""
        return self.row <= tolerance and self.token <= TOKEN_FACTOR * tolerance


def difference(captured: torch.Tensor, recomputed: torch.Tensor) -> Difference:
    """How far ``captured`` is from ``recomputed`` (both [seq, H])."""
    a, b = captured.to(torch.float32), recomputed.to(torch.float32)
    gap = a - b
    per_token = gap.norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-12)
    at = int(per_token.argmax())
    row = float(gap.norm() / b.norm().clamp_min(1e-12))
    return Difference(row, float(per_token[at]), at)
