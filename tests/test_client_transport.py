"""The chat client's HTTP transport against the real simulator over loopback: error statuses and
their bodies, a stalled or dropped stream, a refused connection, TLS, an idle connection the
server closed, one connection per concurrent stream shared by threads, a gzipped stream."""

from __future__ import annotations

import gzip
import http.server
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import uvicorn

from common import errors
from common.models import GenParams
from common.settings import Settings
from simulator.config import SimConfig
from simulator.server import SimServer, create_app
from tests.harness import Procs, free_port, start_simulator, wait_for
from tests.test_client_keepalive import CountingProxy
from tests.test_client_sse import VLLM
from worker.chat.client import ChatClient

ASK = [{"role": "user", "content": "hello"}]


def client_for(endpoint: str, **settings: object) -> ChatClient:
    return ChatClient(endpoint, Settings(endpoints=[endpoint], **settings))


@pytest.mark.parametrize(
    ("option", "kind", "text"),
    [("--p-500", errors.ServerError, "HTTP 500: "), ("--p-429", errors.RateLimited, "HTTP 429: ")],
)
def test_an_error_status_is_its_error_with_the_servers_message(tmp_path, option, kind, text):
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs, option, "1")
        proxy = CountingProxy(int(sim.url.rsplit(":", 1)[1]))
        client = client_for(f"http://127.0.0.1:{proxy.port}/v1")
        try:
            for _ in range(3):
                with pytest.raises(kind) as caught:
                    client.complete(ASK, GenParams())
                # The body was read: the message is the simulator's, not a bare status.
                assert text in str(caught.value) and len(str(caught.value)) > len(text) + 40
        finally:
            client.close()
            proxy.close()
    assert proxy.accepted == 1  # an error body read to its end keeps the connection


def test_a_stalled_stream_is_a_stall_error_with_the_tokens_it_had_streamed(tmp_path):
    with Procs(tmp_path) as procs:
        sim = start_simulator(
            procs, "--p-stall", "1", "--stall-seconds", "30", "--min-answer-tokens", "50"
        )
        client = client_for(sim.endpoint, stall_timeout=0.5)
        try:
            with pytest.raises(errors.StallError) as caught:
                client.complete(ASK, GenParams())
            assert caught.value.tokens_streamed >= 1
        finally:
            client.close()


def test_a_dropped_stream_is_a_disconnect(tmp_path):
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs, "--p-disconnect", "1", "--min-answer-tokens", "50")
        client = client_for(sim.endpoint)
        try:
            with pytest.raises(errors.Disconnected):
                client.complete(ASK, GenParams())
        finally:
            client.close()


def test_nothing_listening_is_a_connect_error():
    client = client_for(f"http://127.0.0.1:{free_port()}/v1", model="m")
    with pytest.raises(errors.ConnectError):
        client.complete(ASK, GenParams())
    with pytest.raises(errors.ConnectError):
        client.probe(2.0)


def test_an_idle_connection_the_server_closed_is_replaced(tmp_path):
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs)
        proxy = CountingProxy(int(sim.url.rsplit(":", 1)[1]))
        endpoint = f"http://127.0.0.1:{proxy.port}/v1"
        client = client_for(endpoint)
        try:
            assert client.complete(ASK, GenParams()).finish_reason == "stop"
            proxy.drop_all()  # as a server's keep-alive timeout does
            assert client.complete(ASK, GenParams()).finish_reason == "stop"
        finally:
            client.close()
            proxy.close()
    assert proxy.accepted == 2


def test_threads_sharing_a_client_keep_one_connection_each(tmp_path):
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs, "--time-per-token", "0.001")
        proxy = CountingProxy(int(sim.url.rsplit(":", 1)[1]))
        endpoint = f"http://127.0.0.1:{proxy.port}/v1"
        client = client_for(endpoint, concurrency=4)
        try:
            with ThreadPoolExecutor(4) as pool:
                asks = [[{"role": "user", "content": f"q {i}"}] for i in range(24)]
                turns = list(pool.map(lambda m: client.complete(m, GenParams()), asks))
            assert all(t.finish_reason == "stop" and t.content for t in turns)
        finally:
            client.close()
            proxy.close()
    assert proxy.accepted <= 4


# --- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA) and its key."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def https_simulator(certificate: tuple[Path, Path]) -> Iterator[str]:
    """The simulator served over TLS (uvicorn's own TLS) in a thread; yields its endpoint."""
    cert, key = certificate
    port = free_port()
    app = create_app(SimConfig())
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
        ssl_certfile=str(cert), ssl_keyfile=str(key),
    )  # fmt: skip
    server = SimServer(config, app.state.sim)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20, "the TLS simulator to start")
    yield f"https://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(20)


def test_an_https_endpoint_is_verified_against_the_trusted_cas(
    https_simulator, certificate, monkeypatch
):
    untrusted = client_for(https_simulator)
    with pytest.raises(errors.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusted.complete(ASK, GenParams())
    untrusted.close()
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # as a deployment trusts its CA
    client = client_for(https_simulator)
    try:
        for _ in range(3):
            assert client.complete(ASK, GenParams()).finish_reason == "stop"
    finally:
        client.close()


def test_requests_carry_the_api_key(tmp_path):
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs)
        proxy = CountingProxy(int(sim.url.rsplit(":", 1)[1]))
        endpoint = f"http://127.0.0.1:{proxy.port}/v1"
        client = client_for(endpoint, api_key="sk-test-key")
        try:
            assert client.complete(ASK, GenParams()).finish_reason == "stop"
        finally:
            client.close()
            proxy.close()
    sent = bytes(proxy.sent).lower()
    assert b"\r\nauthorization: bearer sk-test-key\r\n" in sent
    assert b"post /v1/chat/completions http/1.1\r\n" in sent


def test_a_compressed_stream_from_a_proxy_is_decoded():
    """A proxy may gzip the stream although the request asks for identity."""
    body = gzip.compress(VLLM)

    class Gzipping(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gzipping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = client_for(f"http://127.0.0.1:{server.server_address[1]}/v1", model="m")
    try:
        turn = client.complete(ASK, GenParams())
        assert (turn.reasoning, turn.content, turn.token_ids) == (
            "Think hard",
            "Hé ✓",
            [258, 300, 301, 259, 400, 401, 257],
        )
    finally:
        client.close()
        server.shutdown()
        server.server_close()
