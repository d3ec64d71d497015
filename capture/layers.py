"""Which hidden states a layout stores, in one index space.

``hidden_states`` index ``h`` (transformers' ``output_hidden_states``): 0 is the embeddings,
``h`` the output of decoder layer ``h - 1``, so ``h = L`` is the last layer's output before the
final norm. SpecForge names its aux layers by "output of layer i" (``h = i + 1``), speculators
by "input to layer i" (``h = i``); both defaults pick the same three tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from capture.spec import Layout


@dataclass(frozen=True)
class LayerPlan:
    """The three aux states (as ``hidden_states`` indices) of a run on an L-layer model."""

    layers: int
    aux: tuple[int, int, int]


def default_aux(layout: Layout, layers: int) -> tuple[int, ...]:
    """The trainer's default aux layers, in its own convention."""
    if layout == "specforge":
        return (1, layers // 2 - 1, layers - 4)
    return (2, layers // 2, layers - 3)


def plan(layout: Layout, layers: int, aux: tuple[int, ...] | None) -> LayerPlan:
    """Resolve a run's aux layers for a model with ``layers`` decoder layers."""
    chosen = default_aux(layout, layers) if aux is None else aux
    if len(chosen) != 3:
        raise ValueError(f"three aux layers are needed, not {len(chosen)}: {list(chosen)}")
    shift = 1 if layout == "specforge" else 0
    index = tuple(i + shift for i in chosen)
    if any(not 1 <= h <= layers for h in index):
        where = "0..L-1 (output of layer i)" if shift else "1..L (input to layer i)"
        hint = "" if aux is not None else f"; the defaults do not fit {layers} layers: --aux-layers"
        raise ValueError(f"aux layers {list(chosen)} out of range {where} for L={layers}{hint}")
    return LayerPlan(layers, (index[0], index[1], index[2]))


def parse_aux(text: str | None) -> tuple[int, ...] | None:
    """``--aux-layers i,j,k``."""
    if text is None or not text.strip():
        return None
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"--aux-layers must be integers like 1,15,28, not {text!r}") from None
