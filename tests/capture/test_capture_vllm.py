"""The vLLM backend end to end: a capture worker (``--backend vllm``) against the simulator
serving vLLM's hidden-state extraction with the same tiny model's real states."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from capture.forward import TargetModel
from tests.capture.conftest import ROWS, CaptureStack, check_manifest
from tests.capture.helpers import LAYERS, Reference
from tests.harness import Procs, start_simulator, wait_for

pytestmark = pytest.mark.integration
TOL = {"atol": 1e-5, "rtol": 1e-4}
# Both layouts' defaults on 6 layers, as hidden_states indices, and L (the pre-norm final).
SERVER_LAYERS = "2,3,6"


def _simulator(procs: Procs, model_dir: Path, out: Path, layers: str, *more: str) -> str:
    sim = start_simulator(
        procs, "--hidden-states-model", str(model_dir), "--hidden-states-dir", str(out),
        "--hidden-states-layers", layers, *more, timeout=90,
    )  # fmt: skip
    return sim.endpoint


def test_the_vllm_backend_writes_the_states_of_a_direct_forward_pass_and_of_transformers(
    capture_stack: CaptureStack, tokenized: Path, rows: list[list[int]], model_dir: Path,
    tmp_path: Path,
):  # fmt: skip
    served = tmp_path / "served"
    endpoint = _simulator(capture_stack.procs, model_dir, served, SERVER_LAYERS)
    sf_out, sp_out = tmp_path / "sf", tmp_path / "sp"
    assert capture_stack.enqueue(tokenized, "vsf", sf_out, "specforge").returncode == 0
    assert capture_stack.enqueue(tokenized, "vsp", sp_out, "speculators").returncode == 0
    capture_stack.worker(
        4, "--backend", "vllm", EAGLEGEN_ENDPOINTS=endpoint, EAGLEGEN_CAPTURE_SERVER_DIR=str(served)
    )
    capture_stack.wait_complete("vsf")
    capture_stack.wait_complete("vsp")
    ref, local = Reference(model_dir), TargetModel(str(model_dir))
    for line in check_manifest(sf_out, ROWS):
        ids = rows[line["row"]]
        want = ref.states(ids)
        data = torch.load(sf_out / line["file"], weights_only=True)
        assert data["input_ids"].tolist() == ids
        aux = torch.cat([want[f"layer{i}"] for i in (1, LAYERS // 2 - 1, LAYERS - 4)], dim=-1)
        assert torch.allclose(data["aux_hidden_state"][0], aux, **TOL)
        # Post-norm final: the worker applied the model's final RMSNorm itself.
        assert torch.allclose(data["hidden_state"][0], want["norm"], **TOL)
        assert data["hidden_state"].dtype == torch.float32
        mine = local.forward([ids], (2, 3, 3))[0]  # the transformers backend's states
        assert torch.allclose(data["hidden_state"][0], mine.post_norm, **TOL)
        assert torch.allclose(data["aux_hidden_state"][0], mine.aux.flatten(1), **TOL)
    for line in check_manifest(sp_out, ROWS):
        ids = rows[line["row"]]
        want = ref.states(ids)
        data = load_file(sp_out / line["file"])
        assert data["token_ids"].tolist() == ids
        layers = [want[f"layer{i - 1}"] for i in (2, LAYERS // 2, LAYERS - 3, LAYERS)]
        assert torch.allclose(data["hidden_states"], torch.stack(layers, dim=1), **TOL)
        mine = local.forward([ids], (2, 3, 3))[0]
        assert torch.allclose(data["hidden_states"][:, 3], mine.pre_norm, **TOL)
    assert list(served.iterdir()) == []  # every server file (and its lock) removed


@pytest.mark.parametrize(
    ("layers", "fault", "reason", "kind"),
    [(SERVER_LAYERS, "--hidden-states-wrong-ids", "other prompt ids than the row", "bad_response"),
     ("2,3,4,6", "", "expected", "capture_mismatch"),
     # vLLM #46301: a layer all zeros is refused before its file is written
     (SERVER_LAYERS, "--hidden-states-zeros", "zero_state: aux 0 at token 0", "bad_states")],
    ids=["wrong-echo", "other-layers", "zeros"],
)  # fmt: skip
def test_a_wrong_echo_other_layers_or_zero_states_write_nothing(
    capture_stack: CaptureStack, tokenized: Path, model_dir: Path, tmp_path: Path,
    layers: str, fault: str, reason: str, kind: str,
):  # fmt: skip
    served = tmp_path / "served"
    more = [fault] if fault else []
    endpoint = _simulator(capture_stack.procs, model_dir, served, layers, *more)
    out = tmp_path / "out"
    assert capture_stack.enqueue(tokenized, "bad", out, "speculators").returncode == 0
    capture_stack.env["EAGLEGEN_MAX_RETRIES"] = "0"
    capture_stack.worker(
        4, "--backend", "vllm", EAGLEGEN_ENDPOINTS=endpoint, EAGLEGEN_CAPTURE_SERVER_DIR=str(served)
    )
    store = capture_stack.store("bad")
    wait_for(lambda: store.runs.counts().failed == ROWS, 90, capture_stack.procs.logs)
    assert not (out / "hidden_states").exists() or not any((out / "hidden_states").iterdir())
    assert list(served.iterdir()) == []
    assert reason in capture_stack.procs.logs(20000)
    assert {f.kind for f in store.runs.failures().values()} == {kind}
