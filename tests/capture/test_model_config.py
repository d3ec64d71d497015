"""capture's one config.json reader: what enqueue, the workers and verify all read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.model_config import ModelShape
from common.errors import ConfigError


def _write(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_multimodal_config_is_read_from_its_text_config(tmp_path: Path):
    text = {"num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 100, "rms_norm_eps": 1e-5}
    shape = ModelShape.read(_write(tmp_path, {"text_config": text, "torch_dtype": "bfloat16"}))
    assert (shape.layers, shape.hidden, shape.dtype, shape.vocab) == (4, 64, "bfloat16", 100)
    assert shape.eps == 1e-5 and shape.dtype_bytes == 2 and shape.bytes_for(3) == 3 * 4 * 64 * 2


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"hidden_size": 64}, "not a causal LM's config"),
        ({"num_hidden_layers": 2, "hidden_size": 64, "dtype": "int8"}, "dtype 'int8'"),
    ],
)
def test_what_cannot_be_captured_is_a_one_line_config_error(
    tmp_path: Path, config: dict[str, object], says: str
):
    with pytest.raises(ConfigError, match=says) as caught:
        ModelShape.read(_write(tmp_path, config))
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read"):
        ModelShape.read(tmp_path / "nowhere")
