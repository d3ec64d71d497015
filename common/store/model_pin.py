"""One model per run: the run's meta names it, and an endpoint serving another is refused; the
endpoints out of the run's rotation (they refused its requests whatever the sample).

For draft-model training data a record mixing two models' answers is silent corruption, so the
model is pinned once (from ``EAGLEGEN_MODEL``, or the first model a worker asks for) and every
turn of every record must name it.
"""

from __future__ import annotations

from common import lua
from common.store.base import RunBase


class ModelPin(RunBase):
    """The run's pinned model, the endpoints refused for serving another one, and those out of
    the run's rotation."""

    def pin_model(self, model: str, endpoint: str) -> str:
        """Pin ``model`` if the run has none yet; returns the run's model (another one means
        ``endpoint`` is refused for this run, noted with the reason for ``status``)."""
        k = self.keys
        reason = f"serves {model!r}, not the run's model"
        pinned = self._script(lua.PIN_MODEL)(
            keys=[k.meta, k.retired, k.refused_endpoints], args=[model, endpoint, reason]
        )
        return str(pinned) if pinned else model

    def pinned_model(self) -> str | None:
        """The run's model, if pinned."""
        raw = self.r.hget(self.keys.meta, "model")
        return str(raw) if raw else None

    def take_endpoint_out(self, endpoint: str, reason: str) -> bool:
        """Take ``endpoint`` out of the run's rotation; True if this call did (it was in)."""
        k = self.keys
        return bool(self._script(lua.TAKE_OUT_ENDPOINT)(keys=[k.retired, k.endpoints_out],
                                                        args=[endpoint, reason]))  # fmt: skip

    def endpoints_out(self) -> dict[str, str]:
        """The endpoints out of the run's rotation, and why."""
        return {str(e): str(why) for e, why in self.r.hgetall(self.keys.endpoints_out).items()}

    def bring_endpoints_back(self) -> None:
        """Every endpoint in the run's rotation again (``retry-failed``: the cause was fixed)."""
        self.r.delete(self.keys.endpoints_out)
