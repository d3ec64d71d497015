"""The vLLM backend's checks, without a server: layer ids, the lock, the file's contents."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from capture.server_files import wait_unlocked
from capture.vllm_backend import VllmForward, _Endpoints, server_layers
from common import errors
from common.settings import Settings
from tests.capture.helpers import build_model


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> VllmForward:
    model = build_model(tmp_path_factory.mktemp("vllm-unit") / "model")
    served = tmp_path_factory.mktemp("served")
    settings = Settings(endpoints=["http://127.0.0.1:9/v1"], capture_server_dir=str(served))
    return VllmForward(settings, str(model))


def test_the_servers_layers_are_the_runs_or_a_superset_named_in_the_settings():
    plain = Settings()
    assert server_layers(plain, (2, 3, 3), 6) == [2, 3, 6]
    wide = Settings(capture_server_layers="6,1,3,2")
    assert server_layers(wide, (2, 3, 3), 6) == [1, 2, 3, 6]
    with pytest.raises(errors.CaptureMismatch, match=r"missing \[6\]"):
        server_layers(Settings(capture_server_layers="2,3"), (2, 3, 3), 6)


def test_the_wait_ends_when_the_writer_lets_go_of_the_lock_or_after_the_timeout(tmp_path: Path):
    path = tmp_path / "f.safetensors"
    wait_unlocked(path, 1)  # no lock file: whole already
    fd = os.open(f"{path}.lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with pytest.raises(errors.TimeoutError_):
        wait_unlocked(path, 0.1)
    threading.Timer(0.2, os.close, (fd,)).start()  # vLLM releases the flock, keeps the file
    began = time.monotonic()
    wait_unlocked(path, 5)
    assert 0.1 < time.monotonic() - began < 3


def test_a_file_of_other_ids_layers_or_dtype_is_refused(backend: VllmForward):
    ids = [5, 6, 7]
    good = {"hidden_states": torch.zeros(3, 3, 64), "token_ids": torch.tensor(ids)}
    states = backend._states(good, ids, (2, 3, 3), [2, 3, 6], "u")
    assert states.aux.shape == (3, 3, 64) and states.post_norm.shape == (3, 64)
    with pytest.raises(errors.BadResponse, match="other token ids"):
        backend._states(good, [5, 6, 8], (2, 3, 3), [2, 3, 6], "u")
    with pytest.raises(errors.CaptureMismatch, match="expected"):
        backend._states(good, ids, (2, 3, 3), [2, 3, 4, 6], "u")
    half = {**good, "hidden_states": torch.zeros(3, 3, 64, dtype=torch.bfloat16)}
    with pytest.raises(errors.CaptureMismatch, match="dtype"):
        backend._states(half, ids, (2, 3, 3), [2, 3, 6], "u")


def test_an_endpoint_that_failed_is_passed_over_while_another_is_up():
    urls = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    endpoints = _Endpoints(Settings(endpoints=urls, endpoint_cooldown=60))

    def next_url() -> str:
        with endpoints.borrow() as url:
            return url

    assert [next_url() for _ in range(4)] == urls * 2  # round robin
    endpoints.failed(urls[0])
    assert [next_url() for _ in range(3)] == [urls[1]] * 3
    endpoints.failed(urls[1])  # every endpoint down: still sent somewhere, in turn
    assert sorted(next_url() for _ in range(2)) == sorted(urls)
