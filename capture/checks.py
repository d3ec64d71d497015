"""What a capture bug leaves in a row's tensors, found without running the model.

The field's silent capture bugs each leave a mark here (docs/capture.md names the reports):
states all zero on a layer (vLLM #46301), tensors shorter than the row (vLLM #44485),
NaN or inf, a final state on the wrong side of the final norm (TorchSpec #87, verl-SpeCo #20,
NeMo-Automodel #3083). A capture worker runs them on every row before its file is written;
``capture verify`` runs them again on every file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from capture.forward import NON_FINITE, States
from common import errors

# How far a token's RMS of ``state / norm weight`` may be from 1 and still be after the final
# RMSNorm: rounding to bf16 twice moves it by ~0.4% at most; a state before the norm is
# off by its own scale (tens for a trained model, ~0.02 for a random one).
NORM_TOLERANCE = 0.02


@dataclass(frozen=True)
class Fault:
    """Why a row is bad: a short code (``zero_state``) and what was seen."""

    reason: str
    detail: str


def shape_faults(
    aux: torch.Tensor, finals: dict[str, torch.Tensor], tokens: int, hidden: int
) -> list[Fault]:
    """``aux`` is [tokens, 3, hidden] and each final state [tokens, hidden]."""
    named: dict[str, tuple[torch.Tensor, tuple[int, ...]]] = {"aux": (aux, (tokens, 3, hidden))}
    named.update({name: (t, (tokens, hidden)) for name, t in finals.items()})
    faults = []
    for name, (tensor, wanted) in named.items():
        if tensor.shape[0] != tokens:
            faults.append(Fault("length", f"{name} has {tensor.shape[0]} tokens, the row {tokens}"))
        elif tuple(tensor.shape) != wanted:
            faults.append(Fault("shape", f"{name} is {list(tensor.shape)}, not {list(wanted)}"))
    return faults


def value_faults(slots: dict[str, torch.Tensor]) -> list[Fault]:
    """NaN or inf anywhere; a token whose state in a slot is all zeros or one value repeated
    across the hidden dimension (no layer of a real model gives either). ``slots``: name ->
    [seq, H] or [seq, k, H] (then named ``name k``)."""
    faults: list[Fault] = []
    for name, tensor in slots.items():
        lo, hi = torch.aminmax(tensor, dim=-1)  # NaN propagates: one pass finds it too
        finite = torch.isfinite(lo) & torch.isfinite(hi)
        if not bool(finite.all()):
            faults.append(Fault("nonfinite", f"{_where(name, ~finite)} holds NaN or inf"))
            continue
        flat = lo == hi
        if bool(flat.any()):
            zero = flat & (hi == 0)
            reason, mask = ("zero_state", zero) if bool(zero.any()) else ("constant_state", flat)
            what = "all zeros" if reason == "zero_state" else "constant across the hidden dimension"
            faults.append(Fault(reason, f"{_where(name, mask)} is {what}"))
    return faults


def _where(name: str, mask: torch.Tensor) -> str:
    """'aux 0 at token 3 (and 5 more tokens)' for the first bad (token, slot) of ``mask``."""
    hits = mask.nonzero()
    first = hits[0].tolist()
    label = name if len(first) == 1 else f"{name} {first[1]}"
    more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
    return f"{label} at token {first[0]}{more}"


def normed_rms(state: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """Each token's RMS of ``state / norm`` [seq], ``norm`` the final RMSNorm's weight
    (Llama/Qwen style, ``weight * x / rms(x)``): 1 after the final norm (up to rounding and its
    epsilon), the state's own scale before it."""
    weight = norm.to(torch.float32)
    used = weight != 0  # a zero weight zeroes its dimension: nothing to divide, not counted
    inverse = torch.where(used, 1 / weight, 0.0)
    norms: torch.Tensor = torch.linalg.vector_norm(state.to(torch.float32) * inverse, dim=-1)
    return norms / used.sum().sqrt()


def post_norm_faults(final: torch.Tensor, norm: torch.Tensor) -> list[Fault]:
    """A state that should be after the final norm (SpecForge's ``hidden_state``) and is not:
    some token's normalised RMS is off 1."""
    off = (normed_rms(final, norm) - 1).abs() > NORM_TOLERANCE
    if not bool(off.any()):
        return []
    return [Fault("not_post_norm", f"final state is not after the final norm: {_where('it', off)}")]


def pre_norm_faults(final: torch.Tensor, norm: torch.Tensor) -> list[Fault]:
    """A state that should be before the final norm (speculators' last slot) and is after
    it: every token's normalised RMS is 1 (a state before the norm never is, token by token)."""
    if not bool(((normed_rms(final, norm) - 1).abs() <= NORM_TOLERANCE).all()):
        return []
    return [Fault("post_norm_in_pre_slot", "the pre-norm final slot holds post-norm states")]


def _seen(found: str) -> list[Fault]:
    # The device-side check (capture/forward.py) says what, not where: no host scan of a GPU
    # batch's states (it would cost the worker about 2 CPU-seconds per GB).
    if not found:
        return []
    return [Fault("nonfinite" if found == NON_FINITE else "constant_state", found)]


def check_states(states: States, tokens: int) -> None:
    """Raise the row's permanent failure when its states fail a cheap check (the worker, before
    writing its file): a capture server's zeros or short tensors never reach the disk."""
    finals = {"pre-norm final": states.pre_norm, "final": states.post_norm}
    faults = shape_faults(states.aux, finals, tokens, states.pre_norm.shape[-1])
    if not faults:
        found = states.problem()  # the forward pass's own check, where it ran on the device
        faults = value_faults({"aux": states.aux, **finals}) if found is None else _seen(found)
    if not faults:
        return
    message = "; ".join(f"{f.reason}: {f.detail}" for f in faults)
    if any(f.reason == "nonfinite" for f in faults):
        raise errors.NonFinite(f"the hidden states hold NaN or inf ({message})")
    raise errors.BadStates(message)
