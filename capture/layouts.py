"""A row's states as the file each trainer's offline loader reads.

SpecForge: one ``torch.save`` dict per row (``input_ids``, ``loss_mask``, ``hidden_state``
[1, seq, H] after the final norm, ``aux_hidden_state`` [1, seq, 3H]) under group folders.
speculators: ``hidden_states/hs_<row>.safetensors`` with ``hidden_states`` [seq, 4, H] (the
three aux states and the last layer's output before the final norm) and ``token_ids`` [seq];
the row index is the dataset row holding its ``loss_mask``.
Each file names the run that wrote it, so a file that is not ours is never replaced.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from capture.forward import States
from capture.rows import Row
from capture.spec import Layout

GROUP = 1000  # SpecForge's reader walks the folder; groups keep each folder small
RUN_KEY = "eaglegen_run"


def relative_path(layout: Layout, row: int) -> str:
    """Where a row's file goes, relative to OUT_DIR."""
    if layout == "speculators":
        return f"hidden_states/hs_{row}.safetensors"
    start = row // GROUP * GROUP
    return f"rows_{start}-{start + GROUP}/data_{row}.ckpt"


def encode(layout: Layout, row: Row, states: States, run: str) -> bytes:
    """The file's bytes, tensors in the model's dtype."""
    if layout == "speculators":
        return _speculators(row, states, run)
    return _specforge(row, states, run)


def _specforge(row: Row, states: States, run: str) -> bytes:
    seq, hidden = states.post_norm.shape
    data = {
        "input_ids": torch.tensor(row.input_ids, dtype=torch.long),
        "loss_mask": torch.tensor(row.loss_mask, dtype=torch.long),
        # One copy each, into storage of its own: the states are views of their batch's
        # buffer, and torch.save writes a view's whole storage.
        "hidden_state": states.post_norm.clone().reshape(1, seq, hidden),
        "aux_hidden_state": states.aux.clone().reshape(1, seq, 3 * hidden),
        RUN_KEY: run,
    }
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def _speculators(row: Row, states: States, run: str) -> bytes:
    from safetensors.torch import save

    tensors = {
        "hidden_states": states.aux_and_pre(),
        "token_ids": torch.tensor(row.input_ids, dtype=torch.long),
    }
    return bytes(save(tensors, metadata={RUN_KEY: run}))


def written_by(path: Path, layout: Layout) -> str | None:
    """The run named in a file at ``path`` (None: not an EagleGen file, or unreadable)."""
    try:
        if layout == "speculators":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as fh:
                return (fh.metadata() or {}).get(RUN_KEY)
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # any file we cannot read as ours is not ours
        return None
    found = data.get(RUN_KEY) if isinstance(data, dict) else None
    return found if isinstance(found, str) else None
