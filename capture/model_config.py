"""A target's ``config.json`` as capture reads it: one reader for enqueue, the workers and verify.

A multimodal model's text model is under ``text_config``; the dtype is ``dtype`` (transformers 5)
or ``torch_dtype`` (earlier releases). What cannot be read is a one-line ``ConfigError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What capture needs of a target's config: its depth, width, dtype and limits."""

    layers: int
    hidden: int
    dtype: str  # "float32", "float16" or "bfloat16": the states are written in it
    vocab: int | None = None  # ids at or above it are not the model's
    max_positions: int | None = None  # the longest row the model takes
    eps: float = 1e-6  # the final RMSNorm's epsilon

    @classmethod
    def read(cls, model_dir: Path | str) -> ModelShape:
        """From ``model_dir/config.json``."""
        path = Path(model_dir) / "config.json"
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        config = raw.get("text_config") or raw
        try:
            layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path} is not a causal LM's config (no {exc})") from None
        return cls(
            layers, hidden, _dtype(config, raw, path), _int(config.get("vocab_size")),
            _int(config.get("max_position_embeddings")), float(config.get("rms_norm_eps") or 1e-6),
        )  # fmt: skip

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one value in the model's dtype."""
        return DTYPE_BYTES[self.dtype]

    def bytes_for(self, tokens: int) -> int:
        """Hidden-state bytes of ``tokens`` tokens: 4 states of H each."""
        return tokens * 4 * self.hidden * self.dtype_bytes


def _dtype(config: dict[str, Any], raw: dict[str, Any], path: Path) -> str:
    found = next(
        (c[k] for c in (config, raw) for k in ("dtype", "torch_dtype") if c.get(k)), "float32"
    )
    name = str(found).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ConfigError(
            f"{path}: dtype {name!r} is not one capture writes ({', '.join(DTYPE_BYTES)})"
        )
    return name


def _int(value: Any) -> int | None:
    return int(value) if value else None
