"""Which target a capture run was enqueued for, and whether a worker's model is that one.

Two models of the same depth and width give files of the same shape: only the model itself
tells them apart, and a fine-tune has the same config, file names and sizes as its base. The
identity is a digest of ``config.json``, of the weights as listed (the safetensors index when
there is one, and every weight file's name and size) and of a sample of their bytes (64 KiB
from the middle of each of the first files: inside the tensors, whatever the format), read in
milliseconds whatever the model's size. The folder's path is kept beside it for messages, not
compared: the same model may be mounted elsewhere on another node.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from common.errors import ConfigError

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
INDEX = "model.safetensors.index.json"
SAMPLE_BYTES = 64 * 1024
SAMPLED_FILES = 8


class ModelIdentity(BaseModel):
    """A target model: its folder (as given) and its digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    digest: str

    @classmethod
    def of(cls, model_dir: Path) -> ModelIdentity:
        """The identity of the model in ``model_dir``."""
        digest = hashlib.sha256()
        try:
            digest.update((model_dir / "config.json").read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read {model_dir}/config.json: {exc}") from exc
        digest.update(b"\0")
        if (model_dir / INDEX).is_file():
            digest.update((model_dir / INDEX).read_bytes())
        weights = sorted(p for pattern in WEIGHTS for p in model_dir.glob(pattern))
        for weight in weights:
            digest.update(f"{weight.name}\0{weight.stat().st_size}\0".encode())
        for weight in weights[:SAMPLED_FILES]:
            digest.update(_middle(weight))
        return cls(path=str(model_dir.resolve()), digest=digest.hexdigest())

    def differs(self, worker: ModelIdentity) -> str | None:
        """Why ``worker``'s model may not serve a run pinned to this one (None: it may)."""
        if worker.digest == self.digest:
            return None
        return (
            f"its model {worker.path} (digest {worker.digest[:12]}) is not the run's "
            f"{self.path} (digest {self.digest[:12]})"
        )


def _middle(path: Path) -> bytes:
    size = path.stat().st_size
    with path.open("rb") as fh:
        fh.seek(max(size // 2 - SAMPLE_BYTES // 2, 0))
        return fh.read(SAMPLE_BYTES)
