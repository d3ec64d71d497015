"""``eaglegen capture verify`` on a real capture run's output, clean and corrupted each way the
field's public capture bugs corrupt it (docs/capture.md): it names exactly the bad rows."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load, save

from capture.layouts import RUN_KEY, relative_path
from tests.capture.conftest import ROWS, CaptureStack, check_manifest, manifest
from tests.harness import wait_for

pytestmark = pytest.mark.integration
Tensors = dict[str, Any]


def _verify(stack: CaptureStack, run: str, *more: str) -> tuple[int, dict[str, Any]]:
    done = stack.procs.run(["capture", "verify", "--run", run, "--json", *more], stack.env)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _reasons(report: dict[str, Any]) -> dict[int, set[str]]:
    return {bad["row"]: {r["reason"] for r in bad["reasons"]} for bad in report["bad"]}


def _specforge(blob: bytes) -> Tensors:
    return dict(torch.load(io.BytesIO(blob), weights_only=True))


def _specforge_bytes(data: Tensors) -> bytes:
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def _speculators_bytes(data: Tensors, run: str) -> bytes:
    return bytes(save(data, metadata={RUN_KEY: run}))


class Output:
    """A finished run's folder, edited as a broken capture would have written it: each
    changed file gets a manifest line that matches it (the capture, not the disk, was wrong)."""

    def __init__(self, out: Path, layout: str) -> None:
        self.out = out
        self.layout = layout
        self.lines = {line["row"]: line for line in manifest(out)}

    def path(self, row: int) -> Path:
        return self.out / relative_path(self.layout, row)  # type: ignore[arg-type]

    def edit(self, row: int, change: Callable[[Tensors], None], run: str) -> None:
        blob = self.path(row).read_bytes()
        if self.layout == "specforge":
            data = _specforge(blob)
            change(data)
            self.put(row, _specforge_bytes(data))
        else:
            data = dict(load(blob))
            change(data)
            self.put(row, _speculators_bytes(data, run))

    def put(self, row: int, blob: bytes, listed: bool = True) -> None:
        self.path(row).write_bytes(blob)
        if listed:
            self.lines[row] |= {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}

    def save_manifest(self) -> None:
        text = "".join(json.dumps(line) + "\n" for line in self.lines.values())
        (self.out / "manifest.jsonl").write_text(text)


def _cut(key: str, axis: int, n: int = 16) -> Callable[[Tensors], None]:
    """A row's states ``n`` tokens short, its ids whole (vLLM #44485)."""

    def change(data: Tensors) -> None:
        data[key] = data[key].narrow(axis, 0, data[key].shape[axis] - n).clone()

    return change


def _long_rows(rows: list[list[int]], count: int) -> list[int]:
    found = [i for i, ids in enumerate(rows) if len(ids) > 20]
    assert len(found) >= count, "the fixture's rows are too short to cut 16 tokens"
    return found[:count]


def test_verify_passes_clean_output_and_names_exactly_each_corrupted_row(
    capture_stack: CaptureStack, tokenized: Path, rows: list[list[int]], tmp_path: Path
):
    sf_out, sp_out = tmp_path / "sf", tmp_path / "sp"
    assert capture_stack.enqueue(tokenized, "vf", sf_out, "specforge").returncode == 0
    assert capture_stack.enqueue(tokenized, "vp", sp_out, "speculators").returncode == 0
    code, empty = _verify(capture_stack, "vf", "--sample", "0")  # no file yet: nothing proven
    assert code == 1 and empty["checked"] == 0 and empty["bad"] == [], empty
    capture_stack.worker(concurrency=4)
    for run, out in (("vf", sf_out), ("vp", sp_out)):
        capture_stack.wait_complete(run)
        wait_for(lambda out=out: len(manifest(out)) >= ROWS, 30, "the manifest's last lines")
        check_manifest(out, ROWS)
    capture_stack.procs.stop_all()  # nothing writes the folders while they are edited

    for run in ("vf", "vp"):
        code, clean = _verify(capture_stack, run, "--sample", "1")
        assert code == 0 and clean["ok"], clean
        assert clean["checked"] == clean["recomputed"] == ROWS and clean["bad"] == []
    zero, swap, short, a, b, norm, nan, torn = _long_rows(rows, 8)
    sf, sp = Output(sf_out, "specforge"), Output(sp_out, "speculators")
    pre_norm = load(sp.path(norm).read_bytes())["hidden_states"][:, 3]
    post_norm = _specforge(sf.path(b).read_bytes())["hidden_state"][0]

    def zero_aux(d: Tensors) -> None:
        d["aux_hidden_state"][0, :, :64] = 0  # the first aux layer (vLLM #46301)

    def swap_aux(d: Tensors) -> None:
        aux = d["aux_hidden_state"][0]
        aux[:, :64], aux[:, 128:] = aux[:, 128:].clone(), aux[:, :64].clone()

    def pre_for_post(d: Tensors) -> None:  # verl-SpeCo #20, NeMo-Automodel #3083
        d["hidden_state"] = pre_norm.reshape(1, *pre_norm.shape).clone()

    def poison(d: Tensors) -> None:
        d["hidden_state"][0, 3, 7] = float("nan")

    for row, change in ((zero, zero_aux), (swap, swap_aux), (norm, pre_for_post), (nan, poison)):
        sf.edit(row, change, "vf")
    sf.edit(short, _cut("aux_hidden_state", 1), "vf")
    sf.edit(short, _cut("hidden_state", 1), "vf")
    blob_a, blob_b = sf.path(a).read_bytes(), sf.path(b).read_bytes()
    sf.put(a, blob_b)  # two rows' files swapped (speculators #279: rows mixed in a batch)
    sf.put(b, blob_a)
    sf.put(torn, sf.path(torn).read_bytes()[:-100], listed=False)  # cut after its line (#2080)
    sf.save_manifest()

    code, cheap = _verify(capture_stack, "vf", "--sample", "0")
    assert code == 1 and cheap["recomputed"] == 0
    found = _reasons(cheap)
    # The swapped slots hold real layers' states: only the recompute tells them apart.
    assert set(found) == {zero, short, a, b, norm, nan, torn}, cheap
    assert found[zero] == {"zero_state"} and found[short] == {"length"}
    assert found[norm] == {"not_post_norm"} and found[nan] == {"nonfinite"}
    assert "ids" in found[a] and "ids" in found[b] and found[torn] == {"size", "unreadable"}
    code, full = _verify(capture_stack, "vf", "--sample", "1")
    assert code == 1 and _reasons(full) == {**found, swap: {"recompute"}}, full
    assert full["recomputed"] == ROWS - len(found)  # every row the cheap checks passed
    detail = next(bad for bad in full["bad"] if bad["row"] == swap)["reasons"][0]["detail"]
    assert "aux 0" in detail and "aux 2" in detail and "aux 1" not in detail

    def sp_zero(d: Tensors) -> None:
        d["hidden_states"][:, 1] = 0

    def sp_swap(d: Tensors) -> None:  # the last layer and an aux one (TorchSpec #87)
        hs = d["hidden_states"]
        hs[:, [2, 3]] = hs[:, [3, 2]].clone()

    def post_in_pre(d: Tensors) -> None:
        d["hidden_states"][:, 3] = post_norm

    for row, change in ((zero, sp_zero), (swap, sp_swap), (b, post_in_pre)):
        sp.edit(row, change, "vp")
    sp.edit(short, _cut("hidden_states", 0), "vp")
    sp.save_manifest()
    code, cheap = _verify(capture_stack, "vp", "--sample", "0")
    expected = {zero: {"zero_state"}, short: {"length"}, b: {"post_norm_in_pre_slot"}}
    assert code == 1 and _reasons(cheap) == expected, cheap
    code, full = _verify(capture_stack, "vp", "--sample", "1")
    assert code == 1 and _reasons(full) == {**expected, swap: {"recompute"}}, full
    text = capture_stack.procs.run(["capture", "verify", "--run", "vp"], capture_stack.env)
    assert text.returncode == 1 and f"row {zero}: zero_state" in text.stdout
    assert "recomputed" in text.stdout and "bad rows:" in text.stdout
