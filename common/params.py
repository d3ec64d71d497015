"""Generation parameters from the command line, a file or Redis, checked once (the ranges
are in ``common/sampling.py``); a bad value is one line, never a traceback or a retry loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from common.errors import InvalidParams
from common.sampling import GENERATION_CONFIG_KEYS

M = TypeVar("M", bound=BaseModel)


def one_line(exc: ValidationError) -> str:
    """A pydantic validation error as one line: the first problem, named by its field."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return message if not where or where in message else f"{where}: {message}"


def validated(model: type[M], data: dict[str, Any] | str) -> M:
    """``model`` built from ``data`` (a dict or JSON), or InvalidParams with one line."""
    try:
        if isinstance(data, str):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidParams(f"invalid generation parameters: {one_line(exc)}") from None


def read_generation_config(path: Path) -> dict[str, Any]:
    """The sampling values of a model's ``generation_config.json`` (those vLLM applies)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidParams(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidParams(f"{path}: a generation config is a JSON object")
    return {k: data[k] for k in GENERATION_CONFIG_KEYS if data.get(k) is not None}
