"""``eaglegen capture verify``: every file of a capture run proved against its manifest line,
its tokenized row and the run's model; a sample of rows recomputed by an independent pass.

Per row, without the model: the file is at the row's path, whole (its size and SHA-256 are the
manifest's), loads, names this run, holds the row's ids (and SpecForge's ``loss_mask``), has
the row's length, three aux slots and the model's width and dtype in every tensor, finite values,
no token whose state in a slot is all zeros or constant, and a final state on the right side of
the final norm (``capture/checks.py``). For the sample, each row's states are recomputed
(``capture/recompute.py``) and every slot compared within the dtype's tolerance.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError

from capture.checks import (
    Fault,
    post_norm_faults,
    pre_norm_faults,
    shape_faults,
    value_faults,
)
from capture.layers import plan
from capture.layouts import RUN_KEY, relative_path
from capture.manifest import manifest_path
from capture.recompute import TOKEN_FACTOR, TOLERANCE, Recompute, difference
from capture.rows import Row, Rows, fingerprint
from capture.spec import CaptureSpec, Layout, ManifestLine
from common.errors import ConfigError

SEED = 0  # the sample is the same rows on every verify of a run
SHOWN = 50  # bad rows listed in the plain report


@dataclass(frozen=True)
class Expect:
    """What every file of the run must hold: its layout, run, width, dtype, final norm."""

    layout: Layout
    run: str
    hidden: int
    dtype: torch.dtype
    aux: tuple[int, int, int]  # ``hidden_states`` indices, for the recompute
    norm: torch.Tensor | None  # the final RMSNorm's weight


@dataclass(frozen=True)
class Decoded:
    """A row's file as the checks see it: ``aux`` [seq, 3, H], ``final`` [seq, H]."""

    run: str | None
    ids: list[int]
    mask: list[int] | None
    aux: torch.Tensor
    final: torch.Tensor


class RowSource(Protocol):
    """The tokenized rows (``capture.rows.Rows``), by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Row: ...


class Unfit(Exception):
    """A file that loads but is not the layout's (keys or ranks): nothing more to check."""


@dataclass
class Report:
    """What a verify found."""

    run: str
    layout: str
    out_dir: str
    rows: int  # in the run
    checked: int = 0  # rows of the manifest checked
    recomputed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bad: dict[int, list[Fault]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def by_reason(self) -> dict[str, int]:
        """Bad rows per reason (a row with two reasons counts under each)."""
        found = Counter(f.reason for faults in self.bad.values() for f in {*faults})
        return dict(sorted(found.items()))

    def ok(self) -> bool:
        """No bad row, and something checked (a run with no manifest proves nothing)."""
        return not self.bad and (self.checked > 0 or self.rows == 0)

    def to_json(self) -> dict[str, Any]:
        """For ``--json``."""
        bad = [
            {"row": row, "reasons": [{"reason": f.reason, "detail": f.detail} for f in faults]}
            for row, faults in sorted(self.bad.items())
        ]
        return {
            "run": self.run, "layout": self.layout, "out": self.out_dir, "rows": self.rows,
            "checked": self.checked, "recomputed": self.recomputed,
            "bad_rows": len(self.bad), "by_reason": self.by_reason(), "bad": bad,
            "bytes": self.bytes, "seconds": round(self.seconds, 3), "notes": self.notes,
            "ok": self.ok(),
        }  # fmt: skip


def decode(layout: Layout, blob: bytes) -> Decoded:
    """A file's tensors; ``Unfit`` when it is not the layout's."""
    if layout == "speculators":
        return _speculators(blob)
    return _specforge(blob)


def _specforge(blob: bytes) -> Decoded:
    data = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    try:
        final, aux = data["hidden_state"], data["aux_hidden_state"]
        ids, mask = data["input_ids"].tolist(), data["loss_mask"].tolist()
    except (KeyError, TypeError, AttributeError) as exc:
        raise Unfit(f"not a SpecForge row: {exc!r}") from None
    if final.dim() != 3 or aux.dim() != 3 or final.shape[0] != 1 or aux.shape[0] != 1:
        raise Unfit(f"hidden_state {list(final.shape)}, aux_hidden_state {list(aux.shape)}")
    if aux.shape[2] != 3 * final.shape[2]:
        raise Unfit(f"aux_hidden_state {list(aux.shape)} is not three of {final.shape[2]}")
    run = data.get(RUN_KEY)
    split = aux[0].unflatten(-1, (3, final.shape[2]))
    return Decoded(run if isinstance(run, str) else None, ids, mask, split, final[0])


def _speculators(blob: bytes) -> Decoded:
    from safetensors.torch import load

    data = load(blob)
    try:
        states, ids = data["hidden_states"], data["token_ids"].tolist()
    except KeyError as exc:
        raise Unfit(f"not a speculators row: no {exc}") from None
    if states.dim() != 3 or states.shape[1] != 4:
        raise Unfit(f"hidden_states {list(states.shape)} is not [seq, 4, H]")
    return Decoded(_metadata(blob).get(RUN_KEY), ids, None, states[:, :3], states[:, 3])


def _metadata(blob: bytes) -> dict[str, str]:
    # safetensors' header: an 8-byte little-endian length, then JSON with ``__metadata__``.
    size = int.from_bytes(blob[:8], "little")
    found = json.loads(blob[8 : 8 + size]).get("__metadata__") or {}
    return found if isinstance(found, dict) else {}


def content_faults(got: Decoded, row: Row, expect: Expect) -> list[Fault]:
    """Every cheap check of a decoded file against its row and the run."""
    faults = _identity_faults(got, row, expect.run)
    final_name = "final" if expect.layout == "specforge" else "pre-norm final"
    tokens = len(row.input_ids)
    shapes = shape_faults(got.aux, {final_name: got.final}, tokens, expect.hidden)
    faults += shapes
    dtypes = {str(t.dtype) for t in (got.aux, got.final)} - {str(expect.dtype)}
    if dtypes:
        faults.append(Fault("dtype", f"states in {', '.join(dtypes)}, the model is {expect.dtype}"))
    faults += value_faults({"aux": got.aux, final_name: got.final})
    if expect.norm is not None and not shapes:
        check = post_norm_faults if expect.layout == "specforge" else pre_norm_faults
        faults += check(got.final, expect.norm)
    return faults


def _identity_faults(got: Decoded, row: Row, run: str) -> list[Fault]:
    faults = []
    if got.run != run:
        faults.append(Fault("other_run", f"the file names run {got.run!r}"))
    if got.ids != row.input_ids:
        pairs = zip(got.ids, row.input_ids, strict=False)  # unequal lengths: up to the shorter
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        where = f"first difference at token {at}" if at is not None else "one is a prefix"
        detail = f"{len(got.ids)} ids, the row {len(row.input_ids)}; {where}"
        faults.append(Fault("ids", f"the file's token ids are not row {row.index}'s ({detail})"))
    if got.mask is not None and got.mask != row.loss_mask:
        faults.append(Fault("loss_mask", f"the file's loss_mask is not row {row.index}'s"))
    return faults


def recompute_faults(got: Decoded, row: Row, expect: Expect, model: Recompute) -> list[Fault]:
    """The file's every slot against an independent forward pass of the row."""
    want = model.states(row.input_ids, expect.aux)
    final = want.post_norm if expect.layout == "specforge" else want.pre_norm
    pairs = {f"aux {k}": (got.aux[:, k], want.aux[:, k]) for k in range(3)}
    pairs["final"] = (got.final, final)
    tolerance = TOLERANCE.get(expect.dtype, 1e-3)
    off = []
    for name, (a, b) in pairs.items():
        gap = difference(a, b)
        if not gap.within(tolerance):
            off.append(f"{name} (relative error {gap.row:.3g}, {gap.token:.3g} at token {gap.at})")
    if not off:
        return []
    limits = f"tolerance {tolerance:g}, {TOKEN_FACTOR * tolerance:g} for a token"
    detail = f"differs from a direct forward pass: {', '.join(off)}; {limits}"
    return [Fault("recompute", detail)]


def open_verifier(
    spec: CaptureSpec, run: str, out_dir: Path | None, model: Path | None, device: str,
    share: float,
) -> Verifier:  # fmt: skip
    """The run's expectations from its model (``--model``, else the tokenizer's folder as at
    enqueue), its rows, and the model loaded for the sample when ``share`` > 0."""
    from capture.enqueue import model_of
    from capture.vllm_backend import TargetConfig

    tokenized = Path(spec.tokenized_dir)
    if fingerprint(tokenized) != spec.fingerprint:
        raise ConfigError(f"{tokenized} changed since the run was enqueued: not the run's rows")
    model_dir = model_of(tokenized, model)
    try:
        target = TargetConfig.read(str(model_dir))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot read the model at {model_dir}: {exc!r}") from None
    aux = plan(spec.layout, target.layers, spec.aux_layers).aux
    expect = Expect(spec.layout, run, target.hidden, target.dtype, aux, target.norm_weight)
    recompute = Recompute(str(model_dir), device) if share > 0 else None
    return Verifier(expect, Rows(tokenized), out_dir or Path(spec.out_dir), recompute)


class Verifier:
    """Checks the files of one run, row by row."""

    def __init__(
        self, expect: Expect, rows: RowSource, out_dir: Path, model: Recompute | None = None
    ) -> None:
        self.expect = expect
        self.rows = rows
        self.out_dir = out_dir
        self.model = model
        self.recomputed = 0

    def cheap(self, line: ManifestLine) -> tuple[list[Fault], int]:
        """A manifest line's faults found without the model (none: the row is good) and the
        bytes read. Thread-safe."""
        blob = self._blob(line)
        if isinstance(blob, Fault):
            return [blob], 0
        faults = _whole_faults(blob, line)
        got = _decode(self.expect.layout, blob)
        if isinstance(got, Fault):
            return [*faults, got], len(blob)
        return faults + content_faults(got, self.rows[line.row], self.expect), len(blob)

    def recompute(self, line: ManifestLine) -> list[Fault]:
        """A row that passed the cheap checks against the model's own states (one at a time)."""
        assert self.model is not None
        blob = self._blob(line)
        got = blob if isinstance(blob, Fault) else _decode(self.expect.layout, blob)
        if isinstance(got, Fault):  # changed since its cheap checks
            return [got]
        self.recomputed += 1
        return recompute_faults(got, self.rows[line.row], self.expect, self.model)

    def _blob(self, line: ManifestLine) -> bytes | Fault:
        if not 0 <= line.row < len(self.rows):
            return Fault("unknown_row", f"the dataset has {len(self.rows)} rows")
        rel = relative_path(self.expect.layout, line.row)
        if line.file != rel:
            return Fault("path", f"the manifest names {line.file!r}, the row's file is {rel}")
        try:
            return (self.out_dir / rel).read_bytes()
        except FileNotFoundError:
            return Fault("missing", f"{rel} does not exist")


def _decode(layout: Layout, blob: bytes) -> Decoded | Fault:
    try:
        return decode(layout, blob)
    except Unfit as exc:
        return Fault("shape", str(exc))
    except Exception as exc:  # a torn file: torch and safetensors raise their own errors
        return Fault("unreadable", f"{type(exc).__name__}: {str(exc)[:200]}")


def _whole_faults(blob: bytes, line: ManifestLine) -> list[Fault]:
    if len(blob) != line.bytes:
        return [Fault("size", f"{len(blob)} bytes, the manifest says {line.bytes}")]
    if hashlib.sha256(blob).hexdigest() != line.sha256:
        return [Fault("sha256", "the file's SHA-256 is not the manifest's")]
    return []


def read_manifest(out_dir: Path) -> tuple[list[ManifestLine], list[str]]:
    """The manifest's lines, and notes on the ones that do not parse (a cut last line)."""
    path = manifest_path(out_dir)
    if not path.is_file():
        return [], [f"no manifest at {path}"]
    lines, notes = [], []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        try:
            lines.append(ManifestLine.model_validate_json(text))
        except ValidationError:
            notes.append(f"manifest line {number} does not parse (a cut last line?)")
    return lines, notes


def sample_rows(rows: list[int], share: float) -> set[int]:
    """``share`` of ``rows`` (at least one when above 0), the same ones on every call."""
    if share <= 0 or not rows:
        return set()
    count = min(len(rows), max(1, math.ceil(share * len(rows))))
    return set(random.Random(SEED).sample(sorted(rows), count))


def verify_run(
    spec: CaptureSpec, verifier: Verifier, share: float, jobs: int = 1,
    advance: Callable[[int, int], None] = lambda done, total: None,
) -> Report:  # fmt: skip
    """Every manifest line's row through the cheap checks (``jobs`` rows at a time), then the
    sample recomputed; ``advance(done, total)`` after each row of either pass."""
    began = time.monotonic()
    run = verifier.expect.run
    report = Report(run, spec.layout, str(verifier.out_dir), spec.rows)
    lines, report.notes = read_manifest(verifier.out_dir)
    seen: set[int] = set()
    todo = []
    for line in lines:
        if faults := _line_faults(line, run, seen):
            _add(report, line.row, faults)
        else:
            todo.append(line)
    chosen = sample_rows([line.row for line in todo], share) if verifier.model else set()
    total = len(todo) + len(chosen)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        results = zip(todo, pool.map(verifier.cheap, todo), strict=True)
        for done, (line, (faults, size)) in enumerate(results):
            report.bytes += size
            _add(report, line.row, faults)
            advance(done + 1, total)
    for done, line in enumerate((x for x in todo if x.row in chosen), len(todo) + 1):
        if line.row not in report.bad:
            _add(report, line.row, verifier.recompute(line))
        advance(done, total)
    report.checked, report.recomputed = len(seen), verifier.recomputed
    if (missing := spec.rows - len(seen)) > 0:
        report.notes.append(f"{missing} rows have no manifest line (failed or not yet captured)")
    report.seconds = time.monotonic() - began
    return report


def _add(report: Report, row: int, faults: list[Fault]) -> None:
    if faults:
        report.bad.setdefault(row, []).extend(faults)


def _line_faults(line: ManifestLine, run: str, seen: set[int]) -> list[Fault]:
    if line.run != run:
        return [Fault("other_run", f"the manifest line names run {line.run!r}")]
    if line.row in seen:
        return [Fault("duplicate", "the row has two manifest lines")]
    seen.add(line.row)
    return []


def render(data: dict[str, Any]) -> str:
    """The plain-text report of ``Report.to_json()``."""
    lines = [
        f"capture run {data['run']} ({data['layout']}, {data['out']}): checked {data['checked']} "
        f"of {data['rows']} rows, recomputed {data['recomputed']}; "
        f"{data['bytes'] / 1e9:.3f} GB in {data['seconds']:.1f} s",
    ]
    lines += [f"note: {note}" for note in data["notes"]]
    if data["ok"]:
        return "\n".join([*lines, "every checked row is good"])
    if not data["bad"]:
        return "\n".join([*lines, "no row checked: nothing is proven"])
    reasons = ", ".join(f"{reason} {n}" for reason, n in data["by_reason"].items())
    lines.append(f"bad rows: {data['bad_rows']} ({reasons})")
    for bad in data["bad"][:SHOWN]:
        lines += [f"  row {bad['row']}: {r['reason']}: {r['detail']}" for r in bad["reasons"]]
    if (hidden := len(data["bad"]) - SHOWN) > 0:
        lines.append(f"  ... and {hidden} more bad rows (--json lists them all)")
    return "\n".join(lines)
