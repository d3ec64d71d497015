"""Capture end to end: real Redis, a real capture worker process, both trainers' layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.capture.conftest import ROWS, CaptureStack, check_manifest
from tests.capture.helpers import LAYERS, Reference, make_rows, mask_of, write_tokenized

pytestmark = pytest.mark.integration
TOL = {"atol": 1e-5, "rtol": 1e-4}


def test_both_layouts_hold_the_states_of_a_direct_forward_pass(
    capture_stack: CaptureStack, tokenized: Path, rows: list[list[int]], model_dir: Path,
    tmp_path: Path,
):  # fmt: skip
    sf_out, sp_out = tmp_path / "sf", tmp_path / "sp"
    first = capture_stack.enqueue(tokenized, "sf", sf_out, "specforge")
    assert first.returncode == 0, first.stderr
    assert f"enqueued {ROWS}, already present 0" in first.stderr
    assert capture_stack.enqueue(tokenized, "sp", sp_out, "speculators").returncode == 0
    capture_stack.worker(concurrency=4)
    capture_stack.wait_complete("sf")
    capture_stack.wait_complete("sp")
    ref = Reference(model_dir)
    for line in check_manifest(sf_out, ROWS):
        ids = rows[line["row"]]
        want = ref.states(ids)
        data = torch.load(sf_out / line["file"], weights_only=True)
        assert data["input_ids"].tolist() == ids and data["loss_mask"].tolist() == mask_of(ids)
        # SpecForge's defaults [1, L//2-1, L-4] as "output of layer i"; final after the norm.
        aux = torch.cat([want[f"layer{i}"] for i in (1, LAYERS // 2 - 1, LAYERS - 4)], dim=-1)
        assert data["aux_hidden_state"].shape == (1, len(ids), 3 * 64)
        assert torch.allclose(data["aux_hidden_state"][0], aux, **TOL)
        assert torch.allclose(data["hidden_state"][0], want["norm"], **TOL)
        assert data["hidden_state"].dtype == torch.float32
    for line in check_manifest(sp_out, ROWS):
        ids = rows[line["row"]]
        want = ref.states(ids)
        data = load_file(sp_out / line["file"])
        assert line["file"] == f"hidden_states/hs_{line['row']}.safetensors"
        assert data["token_ids"].tolist() == ids
        # speculators' [2, L//2, L-3] + L as "input to layer i": outputs of i-1, the last
        # layer's before the final norm.
        layers = [want[f"layer{i - 1}"] for i in (2, LAYERS // 2, LAYERS - 3, LAYERS)]
        assert data["hidden_states"].shape == (len(ids), 4, 64)
        assert torch.allclose(data["hidden_states"], torch.stack(layers, dim=1), **TOL)


def test_enqueue_is_idempotent_and_refuses_a_changed_dataset_or_a_foreign_folder(
    capture_stack: CaptureStack, tokenized: Path, model_dir: Path, tmp_path: Path
):
    out = tmp_path / "out"
    assert capture_stack.enqueue(tokenized, "r", out, "speculators").returncode == 0
    again = capture_stack.enqueue(tokenized, "r", out, "speculators")
    assert again.returncode == 0 and f"enqueued 0, already present {ROWS}" in again.stderr
    assert capture_stack.store("r").runs.counts().total == ROWS
    changed = write_tokenized(tmp_path / "changed", make_rows(ROWS, seed=9), model_dir)
    refused = capture_stack.enqueue(changed, "r", out, "speculators")
    assert refused.returncode == 1 and "another tokenized dataset" in refused.stderr
    other = capture_stack.enqueue(tokenized, "r", out, "specforge")
    assert other.returncode == 1 and "other capture settings" in other.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    stranger = capture_stack.enqueue(tokenized, "r2", foreign, "speculators")
    assert stranger.returncode == 1 and "not empty" in stranger.stderr
    assert (foreign / "notes.txt").read_text() == "mine"
    small = capture_stack.enqueue(
        tokenized, "r3", tmp_path / "o3", "specforge", "--aux-layers", "1,2,9"
    )
    assert small.returncode == 1 and "out of range" in small.stderr


def test_status_shows_the_capture_run(capture_stack: CaptureStack, tokenized: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert capture_stack.enqueue(tokenized, "st", out, "speculators").returncode == 0
    before = capture_stack.procs.run(["status", "--run", "st", "--json"], capture_stack.env)
    data = json.loads(before.stdout)
    assert data["kind"] == "capture" and data["total"] == ROWS and data["done"] == 0
    capture_stack.worker(concurrency=2)
    capture_stack.wait_complete("st")
    after = json.loads(
        capture_stack.procs.run(["status", "--run", "st", "--json"], capture_stack.env).stdout
    )
    sizes = sum(p.stat().st_size for p in (out / "hidden_states").iterdir())
    assert after["done"] == ROWS and after["written"] == ROWS and after["bytes"] == sizes
    assert after["tokens"] == sum(len(r) for r in make_rows(ROWS)) and after["tokens_per_s"] > 0
    text = capture_stack.procs.run(["status", "--run", "st"], capture_stack.env).stdout
    assert f"done {ROWS}, failed 0" in text and "tokens/s" in text and "ETA" in text
