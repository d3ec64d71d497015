"""The requests a run's lease holders have running on the servers, by sample.

Saved right after a request's first chunk (the server's own id is in it), so that whoever takes
a sample's lease over, or the reconciler reaping it, can abort the old holder's request on its
server (worker/pipeline/aborts.py): a paused worker's stream would otherwise run to
``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from pydantic import BaseModel
from redis.commands.core import Script

from common import lua
from common.keys import RunKeys


class RequestRef(BaseModel):
    """A generation request running on a server for a sample."""

    endpoint: str
    server_id: str  # the server's own id (vLLM: ``chatcmpl-<X-Request-Id>``)
    token: str  # the lease token of the worker that sent it
    max_tokens: int = 0  # what it asked for: at most what an abort saves
    base: int = 0  # tokens of the turn before it (a continuation's checkpoint)


class RequestStore:
    """Running requests of one run's samples (``WorkerStore`` and ``ReconcileStore`` are)."""

    r: redis.Redis
    keys: RunKeys
    _script: Callable[[str], Script]  # common/store/base.py

    def record_request(self, sample_id: str, ref: RequestRef) -> bool:
        """Keep ``ref`` as the sample's running request while its token holds the lease."""
        k = self.keys
        written = self._script(lua.SAVE_REQUEST)(
            keys=[k.lease_owner, k.requests, k.reaped],
            args=[sample_id, ref.token, ref.model_dump_json()],
        )
        return bool(written)

    def pop_own_request(self, sample_id: str, token: str) -> RequestRef | None:
        """The sample's running request if ``token``'s holder sent it, removed; else None."""
        raw = self._script(lua.POP_OWN_REQUEST)(keys=[self.keys.requests], args=[sample_id, token])
        return RequestRef.model_validate_json(raw) if raw else None

    def pop_requests(self, ids: list[str]) -> dict[str, RequestRef]:
        """The running requests recorded for ``ids``, removed (whoever pops one aborts it)."""
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=True)
        pipe.hmget(self.keys.requests, ids)
        pipe.hdel(self.keys.requests, *ids)
        found, _ = pipe.execute()
        return {i: RequestRef.model_validate_json(v) for i, v in zip(ids, found, strict=True)
                if v}  # fmt: skip
