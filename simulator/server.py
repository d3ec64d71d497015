"""OpenAI-compatible HTTP server standing in for vLLM on machines without a GPU (not a model).

The answers come from `simulator.answers` (pure) and the faults from `simulator.faults` (pure);
the modules around this one add what needs a network and a clock: admission, pacing, SSE
framing, fault delivery, metrics and the generation log. This one assembles the app and runs it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

from simulator.config import SimConfig
from simulator.generation import SimulatedDisconnect
from simulator.handlers import (
    abort_requests,
    chat_completions,
    completions,
    health,
    metrics,
    models,
    sim_config,
    sim_stats,
)
from simulator.state import SimState


def create_app(cfg: SimConfig) -> Starlette:
    """Return the simulator ASGI app; its state lives in `app.state.sim`."""
    state = SimState(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        state.log.close()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/inference/v1/abort_requests", abort_requests, methods=["POST"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
        Route("/sim/config", sim_config, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = state
    return app


class _HideSimulatedDisconnects(logging.Filter):
    """Keeps uvicorn from logging a traceback for every deliberately dropped connection."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedDisconnect)


_DISCONNECT_FILTER = _HideSimulatedDisconnects()


class SimServer(uvicorn.Server):
    """uvicorn server that releases stalled generations as soon as shutdown begins."""

    def __init__(self, config: uvicorn.Config, state: SimState) -> None:
        super().__init__(config)
        self.sim_state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Wake stalled generations first, then shut down as uvicorn does."""
        # uvicorn waits for open connections before the lifespan shutdown, so a stall
        # would otherwise hold the server up for stall_seconds.
        self.sim_state.stopping.set()
        await super().shutdown(sockets=sockets)


def create_server(cfg: SimConfig, host: str = "127.0.0.1", port: int = 8000) -> SimServer:
    """Return a configured (not started) uvicorn server for the simulator."""
    app = create_app(cfg)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    # Added after uvicorn.Config, which (re)configures logging.
    logging.getLogger("uvicorn.error").addFilter(_DISCONNECT_FILTER)
    return SimServer(config, app.state.sim)


def serve(cfg: SimConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the simulator until interrupted."""
    create_server(cfg, host, port).run()
