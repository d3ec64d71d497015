"""Run in the trainers' venv: SpecForge's and speculators' offline loaders read capture output.

    python capture_loaders.py SPECFORGE_DIR SPECULATORS_DATA HIDDEN_STATES_DIR EXPECTED.pt OUT.json

``EXPECTED.pt`` holds, per row, the ids, mask and states EagleGen's test computed directly;
what each loader hands its trainer is compared with them here and the verdicts written out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from hs_connectors import FileTransfer
from specforge.data.preprocessing import build_offline_eagle3_dataset, list_local_files
from speculators.train.data import ArrowDataset


def specforge(folder: str, expected: dict, report: dict) -> None:
    files = list_local_files(folder)
    dataset = build_offline_eagle3_dataset(folder, max_len=4096)
    report["specforge_files"] = len(files)
    bad = []
    for i in range(len(dataset)):
        item = dataset[i]
        row = int(Path(files[i]).stem.split("_")[1])
        want = expected[row]
        ok = (
            item["input_ids"][0].tolist() == want["ids"]
            and torch.allclose(item["hidden_state"][0], want["aux"].flatten(1), atol=1e-6)
            and torch.allclose(item["target"][0], want["post"], atol=1e-6)
            and item["loss_mask"][0, :-1].tolist() == want["mask"][:-1]
        )
        if not ok:
            bad.append(row)
    report["specforge_bad"] = bad


def speculators(data: str, hidden: str, expected: dict, report: dict) -> None:
    dataset = ArrowDataset(
        max_len=4096,
        datapath=data,
        transfer=FileTransfer(Path(hidden)),
        on_missing="raise",
        hidden_states_dtype=torch.float32,
    )
    bad = []
    for i in range(len(dataset)):
        item = dataset[i]
        want = expected[i]
        ok = (
            item["input_ids"].tolist() == want["ids"]
            and torch.allclose(item["hidden_states"], want["aux"].flatten(1), atol=1e-6)
            and torch.allclose(item["verifier_last_hidden_states"], want["pre"], atol=1e-6)
            and item["loss_mask"].tolist() == want["mask"]
        )
        if not ok:
            bad.append(i)
    report["speculators_rows"] = len(dataset)
    report["speculators_bad"] = bad


def main() -> None:
    sf_dir, sp_data, hidden, expected_path, out = sys.argv[1:6]
    expected = torch.load(expected_path, weights_only=True)
    report: dict = {}
    specforge(sf_dir, expected, report)
    speculators(sp_data, hidden, expected, report)
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
