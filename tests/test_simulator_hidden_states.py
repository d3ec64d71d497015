"""The simulator's stand-in for vLLM's hidden-state extraction: real states, vLLM's file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from starlette.testclient import TestClient

from simulator.config import SimConfig
from simulator.server import create_app
from tests.capture.helpers import LAYERS, Reference, build_model

IDS = [5, 17, 300, 42, 9, 111, 7]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("sim-hs") / "model")


def _client(model_dir: Path, out: Path, **more: object) -> TestClient:
    cfg = SimConfig(
        hidden_states_model=model_dir, hidden_states_dir=out, hidden_states_layers=[6, 0, 3],
        **more,
    )  # fmt: skip
    return TestClient(create_app(cfg))


def _whole(path: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while os.path.exists(path + ".lock"):
        assert time.monotonic() < deadline, "the lock file stayed"
        time.sleep(0.01)


def test_a_token_id_completion_of_one_token_names_a_file_of_the_model_states(
    model_dir: Path, tmp_path: Path
):
    client = _client(model_dir, tmp_path)
    body = {"prompt": IDS, "max_tokens": 1, "return_token_ids": True}
    answer = client.post("/v1/completions", json=body).json()
    assert answer["choices"][0]["prompt_token_ids"] == IDS
    path = answer["kv_transfer_params"]["hidden_states_path"]
    assert Path(path).parent == tmp_path
    _whole(path)
    data = load_file(path)
    assert data["token_ids"].tolist() == IDS and data["token_ids"].dtype == torch.int64
    # Ascending ids, each before the final norm: embeddings, output of layer 2, of the last.
    want = Reference(model_dir).states(IDS)
    embeds = Reference(model_dir).model.model.embed_tokens(torch.tensor(IDS))
    assert data["hidden_states"].shape == (len(IDS), 3, 64)
    assert torch.allclose(data["hidden_states"][:, 0], embeds, atol=1e-6)
    assert torch.allclose(data["hidden_states"][:, 1], want["layer2"], atol=1e-5)
    assert torch.allclose(data["hidden_states"][:, 2], want[f"layer{LAYERS - 1}"], atol=1e-5)
    assert client.get("/sim/stats").json()["hidden_states"] == 1


def test_other_requests_are_answered_as_before_and_the_fault_echoes_other_ids(
    model_dir: Path, tmp_path: Path
):
    client = _client(model_dir, tmp_path, hidden_states_wrong_ids=True)
    text = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).json()
    longer = client.post("/v1/completions", json={"prompt": IDS, "max_tokens": 4}).json()
    assert "kv_transfer_params" not in text and "kv_transfer_params" not in longer
    assert list(tmp_path.iterdir()) == []
    body = {"prompt": IDS, "max_tokens": 1, "return_token_ids": True}
    answer = client.post("/v1/completions", json=body).json()
    assert answer["choices"][0]["prompt_token_ids"] == [IDS[0] + 1, *IDS[1:]]
    path = answer["kv_transfer_params"]["hidden_states_path"]
    _whole(path)
    assert load_file(path)["token_ids"].tolist() == [IDS[0] + 1, *IDS[1:]]


def test_a_model_without_a_folder_or_layers_is_refused(model_dir: Path):
    with pytest.raises(ValueError, match="hidden_states_dir"):
        SimConfig(hidden_states_model=model_dir)
