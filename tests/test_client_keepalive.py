"""The HTTP client keeps one connection per endpoint: streams are read to their end."""

from __future__ import annotations

import contextlib
import socket
import threading

from common.models import GenParams
from common.settings import Settings
from tests.harness import Procs, free_port, start_simulator
from worker.chat.client import ChatClient


class CountingProxy:
    """A loopback TCP forwarder that counts the connections clients open through it, keeps
    what clients sent, and can drop every connection (as a server's keep-alive timeout)."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.accepted = 0
        self.sent = bytearray()  # what clients sent, all connections together
        self.open: list[socket.socket] = []
        self.clients: set[socket.socket] = set()
        self.listener = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            self.open += [client, upstream]
            self.clients.add(client)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with src, dst:
            try:
                while data := src.recv(65536):
                    if src in self.clients:
                        self.sent += data
                    dst.sendall(data)
            except OSError:
                pass  # dropped by drop_all

    def drop_all(self) -> None:
        """Shut every open connection down, both sides."""
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.open.clear()

    def close(self) -> None:
        self.listener.close()


def test_sequential_streamed_turns_reuse_one_connection(tmp_path):
    with Procs(tmp_path) as procs:
        sim = start_simulator(procs)
        proxy = CountingProxy(int(sim.url.rsplit(":", 1)[1]))
        endpoint = f"http://127.0.0.1:{proxy.port}/v1"
        client = ChatClient(endpoint, Settings(endpoints=[endpoint]))
        try:
            for i in range(6):
                turn = client.complete([{"role": "user", "content": f"q {i}"}], GenParams())
                assert turn.finish_reason == "stop"
        finally:
            client.close()
            proxy.close()
    assert proxy.accepted == 1
