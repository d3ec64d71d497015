"""A capture server names the file the worker reads and removes: only files in
``EAGLEGEN_CAPTURE_SERVER_DIR``, of the connector's name shape, regular, and of the row's size
are read; a refused path is named in a ``BadResponse`` and nothing is read or removed.

The server is a loopback HTTP server answering every completion with the path the test sets.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from capture.vllm_backend import VllmForward
from common import errors
from common.settings import Settings
from tests.capture.helpers import HIDDEN, build_model

pytestmark = pytest.mark.integration
IDS = [5, 6, 7]
LAYERS = [2, 3, 6]


class _Answers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._send({"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        choice = {"index": 0, "text": "", "prompt_token_ids": IDS, "finish_reason": "length"}
        params = {"hidden_states_path": self.server.path}
        self._send({"choices": [choice], "kv_transfer_params": params})

    def _send(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    path = ""


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Answers)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("paths") / "model")


@pytest.fixture
def served(tmp_path: Path) -> Path:
    folder = tmp_path / "served"
    folder.mkdir()
    return folder


@pytest.fixture
def backend(server: _Server, model: Path, served: Path) -> Iterator[VllmForward]:
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    settings = Settings(
        endpoints=[url], capture_server_dir=str(served), capture_lock_timeout=2.0, model="m"
    )
    forward = VllmForward(settings, str(model))
    yield forward
    forward.close()


def _states_file(path: Path) -> Path:
    states = torch.zeros(len(IDS), len(LAYERS), HIDDEN)
    save_file({"hidden_states": states, "token_ids": torch.tensor(IDS)}, str(path))
    return path


def _victims(folder: Path) -> dict[Path, bytes]:
    folder.mkdir(exist_ok=True)
    victim = _states_file(folder / "precious.safetensors")
    lock = folder / "precious.safetensors.lock"
    lock.write_bytes(b"mine")
    return {victim: victim.read_bytes(), lock: lock.read_bytes()}


def _row(backend: VllmForward, server: _Server, named: str) -> BaseException:
    """The row's error, asked on a thread so that a hang fails the test instead of blocking."""
    server.path = named
    caught: list[BaseException] = []

    def call() -> None:
        try:
            backend.row(IDS, (2, 3, 3), LAYERS)
        except BaseException as exc:  # handed to the test
            caught.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), f"the row hung on {named}"
    assert caught, f"{named} was accepted"
    return caught[0]


def test_a_file_in_the_folder_is_read_and_then_removed(
    backend: VllmForward, server: _Server, served: Path
):
    path = _states_file(served / "cmpl-1-0.safetensors")
    server.path = str(path)
    states = backend.row(IDS, (2, 3, 3), LAYERS)
    assert states.aux.shape == (len(IDS), 3, HIDDEN)
    assert list(served.iterdir()) == []


@pytest.mark.parametrize("how", ["outside", "dotdot", "symlink", "symlinked-folder", "relative"])
def test_a_path_out_of_the_folder_is_refused_and_every_victim_file_stays(
    backend: VllmForward, server: _Server, served: Path, tmp_path: Path, how: str
):
    outside = tmp_path / "home"
    victims = _victims(outside)
    named = {
        "outside": str(outside / "precious.safetensors"),
        "dotdot": f"{served}/../home/precious.safetensors",
        "symlink": str(served / "cmpl-2-0.safetensors"),
        "symlinked-folder": str(served / "link" / "precious.safetensors"),
        "relative": "precious.safetensors",
    }[how]
    (served / "cmpl-2-0.safetensors").symlink_to(outside / "precious.safetensors")
    (served / "link").symlink_to(outside, target_is_directory=True)
    exc = _row(backend, server, named)
    assert isinstance(exc, errors.BadResponse) and named in str(exc), exc
    assert {p: p.read_bytes() for p in victims} == victims
    assert (served / "cmpl-2-0.safetensors").is_symlink() and (served / "link").is_symlink()


def test_a_fifo_for_a_lock_or_an_oversized_file_is_refused_without_hanging_or_reading(
    backend: VllmForward, server: _Server, served: Path
):
    fifo_row = _states_file(served / "cmpl-3-0.safetensors")
    os.mkfifo(f"{fifo_row}.lock")
    assert isinstance(_row(backend, server, str(fifo_row)), errors.BadResponse)
    assert fifo_row.exists()
    weights = served / "cmpl-4-0.safetensors"
    with weights.open("wb") as fh:
        fh.truncate(8 << 30)  # sparse: 8 GB that must not be read
    exc = _row(backend, server, str(weights))
    assert isinstance(exc, errors.BadResponse) and "not read" in str(exc), exc
    assert weights.stat().st_size == 8 << 30
