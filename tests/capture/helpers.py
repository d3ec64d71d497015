"""What the capture tests share: a small target model, tokenized rows, a direct forward pass.

The model is a random-weight Qwen3 (6 layers, so every trainer default fits), saved with
safetensors like any local model; the rows are written by ``eaglegen tokenize``'s own dataset
writer. The reference states come from hooks on the decoder layers and the final norm of a
model loaded apart from the worker's: another path to the same tensors than the capture
code's ``output_hidden_states``.
"""

from __future__ import annotations

import json
import random
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.sink import DatasetSink, OutRow

LAYERS = 6
HIDDEN = 64
VOCAB = 512


def build_model(
    out: Path, dtype: str = "float32", nan_token: int | None = None, seed: int = 0
) -> Path:
    """A random Qwen3ForCausalLM in ``out``; ``nan_token``: that token's embedding is NaN;
    ``seed``: another seed, another model of the same shape."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=0,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    if nan_token is not None:
        with torch.no_grad():
            model.model.embed_tokens.weight[nan_token] = float("nan")
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_rows(count: int, seed: int = 1, low: int = 5, high: int = 40) -> list[list[int]]:
    """``count`` rows of random ids (no 0: the pad id), lengths in [low, high]."""
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(low, high))] for _ in range(count)]


def write_tokenized(out: Path, rows: list[list[int]], model_dir: Path) -> Path:
    """A folder laid out as ``eaglegen tokenize`` writes it (dataset/, stats.json)."""
    out.mkdir(parents=True, exist_ok=True)
    items = [
        OutRow(f"s{i}", array("i", ids), np.array(_mask(len(ids)), dtype=np.int8), False, "")
        for i, ids in enumerate(rows)
    ]
    with DatasetSink(out / "dataset", False) as sink:
        sink.write(items)
    (out / "stats.json").write_text(json.dumps({"tokenizer": str(model_dir)}))
    return out


def _mask(n: int) -> list[int]:
    return [0] * (n // 2) + [1] * (n - n // 2)


def mask_of(ids: list[int]) -> list[int]:
    """The loss mask ``write_tokenized`` gave a row."""
    return _mask(len(ids))


class Reference:
    """A direct, unbatched forward pass; states by hooks on each decoder layer and the norm."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").eval()
        self.outputs: dict[str, torch.Tensor] = {}
        decoder = self.model.model
        for i, layer in enumerate(decoder.layers):
            layer.register_forward_hook(self._keep(f"layer{i}"))
        decoder.norm.register_forward_hook(self._keep("norm"))

    def _keep(self, name: str) -> Any:
        def hook(_m: Any, _args: Any, out: Any) -> None:
            self.outputs[name] = out[0] if isinstance(out, tuple) else out

        return hook

    @torch.no_grad()
    def states(self, ids: list[int]) -> dict[str, torch.Tensor]:
        """``layer<i>`` [seq, H] (output of layer i) and ``norm`` [seq, H] (after the norm)."""
        self.model(torch.tensor([ids]))
        return {k: v[0] for k, v in self.outputs.items()}
