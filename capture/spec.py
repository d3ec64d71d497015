"""What a capture run is: its input, output, layout and layers, fixed for the run's life."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from capture.identity import ModelIdentity

Layout = Literal["specforge", "speculators"]
LAYOUTS: tuple[Layout, ...] = ("specforge", "speculators")


class CaptureSpec(BaseModel):
    """A capture run's parameters, kept in the run's meta hash (JSON)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokenized_dir: str
    fingerprint: str  # of the tokenized dataset: a changed dataset under the run is refused
    out_dir: str
    layout: Layout
    # In the layout's own convention (SpecForge: output of layer i; speculators: input to
    # layer i); None: the trainer's defaults for the model's layer count.
    aux_layers: tuple[int, ...] | None = None
    rows: int = Field(ge=0)
    # The target the run was enqueued for (None: a run made before runs were pinned).
    model: ModelIdentity | None = None


class RowRef(BaseModel):
    """A task's row, as stored beside the lease: its index and its length."""

    model_config = ConfigDict(frozen=True)

    row: int
    tokens: int


class ManifestLine(BaseModel):
    """One line of ``manifest.jsonl``: a row's file, written once.

    ``schema``, ``id`` and ``run`` lead, as in a generation record, so the collector's JSONL
    sink (which recognises EagleGen's files by them) writes the manifest unchanged.
    """

    schema_: int = Field(default=1, alias="schema")
    id: str
    run: str
    row: int
    sample: str  # the tokenized row's own id
    file: str  # relative to OUT_DIR
    tokens: int
    bytes: int
    sha256: str

    model_config = ConfigDict(populate_by_name=True)

    def to_json(self) -> str:
        """Compact JSON, ``schema`` first."""
        return self.model_dump_json(by_alias=True)
