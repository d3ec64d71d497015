"""SpecForge 0.2.0's and speculators 0.9.0's offline loaders read capture files as written.

The files are made by capture's own code (the forward pass, the layouts, the atomic write: what
a capture worker runs; tests/capture runs it in real worker processes); the loaders run in the
trainers' venv (tests/trainers/capture_loaders.py) and must give their trainers the ids, mask
and states of a direct forward pass, speculators' dataset being `eaglegen export`'s. Each file
passes `capture verify`'s cheap checks first: the files verify passes are the files they load.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from capture.files import write_atomic
from capture.forward import TargetModel
from capture.layers import plan
from capture.layouts import encode, relative_path
from capture.rows import Rows
from capture.verify import Expect, content_faults, decode
from tests.capture.helpers import build_model, make_rows, write_tokenized
from tests.trainers.test_trainers import trainers_python
from training.export import export

pytestmark = pytest.mark.trainers
DRIVER = Path(__file__).resolve().parent / "capture_loaders.py"


def _capture(rows: Rows, model: TargetModel, layout: str, out: Path) -> dict[int, dict]:
    aux = plan(layout, model.layers, None).aux  # type: ignore[arg-type]
    norm = model._decoder.norm.weight.detach()
    verified = Expect(layout, "trainers", model.hidden, model.dtype, aux, norm)  # type: ignore[arg-type]
    expected = {}
    for i in range(len(rows)):
        row = rows[i]
        states = model.forward([row.input_ids], aux)[0]
        data = encode(layout, row, states, "trainers")  # type: ignore[arg-type]
        assert content_faults(decode(layout, data), row, verified) == []  # type: ignore[arg-type]
        write_atomic(out / relative_path(layout, i), data, lambda p: False)  # type: ignore[arg-type]
        expected[i] = {"ids": row.input_ids, "mask": row.loss_mask, "aux": states.aux,
                       "pre": states.pre_norm, "post": states.post_norm}  # fmt: skip
    return expected


def test_both_trainers_offline_loaders_read_capture_output(tmp_path: Path):
    python = trainers_python()
    model_dir = build_model(tmp_path / "model")
    tokenized = write_tokenized(tmp_path / "tok", make_rows(12), model_dir)
    (tokenized / "conversations.jsonl").write_text("")
    export(tokenized, tmp_path / "export", trainers=("speculators",))
    rows, model = Rows(tokenized), TargetModel(str(model_dir))
    expected = _capture(rows, model, "specforge", tmp_path / "sf")
    assert _capture(rows, model, "speculators", tmp_path / "sp").keys() == expected.keys()
    torch.save(expected, tmp_path / "expected.pt")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    args = [str(tmp_path / "sf"), str(tmp_path / "export" / "speculators" / "data")]
    args += [str(tmp_path / "sp" / "hidden_states"), str(tmp_path / "expected.pt")]
    done = subprocess.run(
        [str(python), str(DRIVER), *args, str(tmp_path / "report.json")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["specforge_files"] == 12 and report["specforge_bad"] == []
    assert report["speculators_rows"] == 12 and report["speculators_bad"] == []
