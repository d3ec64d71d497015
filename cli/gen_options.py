"""The generation options ``enqueue`` and ``retry-failed`` share, and the parameters they make.

Unset sampling options are not sent (the server's generation config applies); typer checks no
range here, so that every bad value gets the one check of ``common/sampling.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from common.params import read_generation_config

MaxTokensOpt = Annotated[
    int | None, typer.Option(help="Most tokens per assistant turn [default: 2048].")
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(help="Sampling temperature, 0-2 (0: greedy). Unset: the server's default."),
]
TopPOpt = Annotated[float | None, typer.Option(help="Nucleus sampling, (0, 1]. Unset: server's.")]
TopKOpt = Annotated[int | None, typer.Option(help="Top-k sampling (-1: off). Unset: server's.")]
MinPOpt = Annotated[float | None, typer.Option(help="Min-p sampling, 0-1. Unset: server's.")]
GenerationConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--generation-config",
        help="The model's generation_config.json: its sampling values are sent and recorded "
        "(options given here win).",
    ),
]


def given_params(
    generation_config: Path | None, max_tokens: int | None, **sampling: float | int | None
) -> dict[str, Any]:
    """The generation parameters given on the line (and in a generation config), by name."""
    given = sampling_values(generation_config, **sampling)
    if max_tokens is not None:
        given["max_tokens"] = max_tokens
    return given


def sampling_values(generation_config: Path | None, **given: float | int | None) -> dict[str, Any]:
    """The sampling values to send: the generation config's, then those given on the line."""
    values = read_generation_config(generation_config) if generation_config else {}
    values.update({name: value for name, value in given.items() if value is not None})
    return values
