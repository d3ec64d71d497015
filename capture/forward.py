"""The target's forward pass: every hidden state a layout needs, for a batch of rows.

The model is loaded once per process in its own dtype (a float32 model gives float32 states,
bf16 gives bf16: nothing is cast). Rows are right-padded into one batch: a causal model's
states of real tokens do not see the padding after them. transformers'
``output_hidden_states`` gives the embeddings and each layer's output; its last entry is
after the final norm in some versions and not in others, so the last layer's output before the
norm and the normed one are both taken from hooks on the final norm itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class States:
    """One row's states: ``aux`` [seq, 3, H], the final layer's output before the norm
    ``pre_norm`` [seq, H] and after it ``post_norm`` [seq, H]."""

    aux: torch.Tensor
    pre_norm: torch.Tensor
    post_norm: torch.Tensor

    def finite(self) -> bool:
        """False when any value is NaN or inf."""
        return all(bool(torch.isfinite(t).all()) for t in (self.aux, self.pre_norm, self.post_norm))


class TargetModel:
    """A causal LM loaded once; ``forward`` is serialised (one batch at a time per process)."""

    def __init__(self, model_dir: str, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        self.model: Any = model.eval().to(device)  # type: ignore[no-untyped-call]
        self.device = torch.device(device)
        config = model.config
        self.layers = int(config.num_hidden_layers)
        self.hidden = int(config.hidden_size)
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self.pad_id = int(getattr(config, "pad_token_id", None) or 0)
        self._decoder: Any = model.get_decoder()  # type: ignore[no-untyped-call]
        self._norm_io: dict[str, torch.Tensor] = {}
        self._decoder.norm.register_forward_hook(self._keep_norm_io)
        self._lock = threading.Lock()

    def _keep_norm_io(self, _module: Any, args: tuple[torch.Tensor, ...], out: Any) -> None:
        self._norm_io["pre"] = args[0]
        self._norm_io["post"] = out

    def close(self) -> None:
        """Nothing to let go of: the model goes with the process."""

    @torch.inference_mode()
    def forward(self, batch: list[list[int]], aux: tuple[int, int, int]) -> list[States]:
        """States of each row of ``batch`` (token ids); ``aux``: ``hidden_states`` indices."""
        longest = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for b, row in enumerate(batch):
            ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[b, : len(row)] = 1
        with self._lock:
            out = self._decoder(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                output_hidden_states=True, use_cache=False,
            )  # fmt: skip
            pre, post = self._norm_io.pop("pre"), self._norm_io.pop("post")
        hidden = out.hidden_states
        picked = [pre if h == self.layers else hidden[h] for h in aux]
        stacked = torch.stack(picked, dim=2)  # [batch, seq, 3, H]
        lengths = [len(row) for row in batch]
        return [_row_states(stacked, pre, post, b, n) for b, n in enumerate(lengths)]


def _row_states(
    stacked: torch.Tensor, pre: torch.Tensor, post: torch.Tensor, b: int, n: int
) -> States:
    # Copies: a view would keep (and torch.save would write) the whole batch's storage.
    return States(stacked[b, :n].cpu().clone(), pre[b, :n].cpu().clone(), post[b, :n].cpu().clone())
