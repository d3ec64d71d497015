"""The cheap checks on a row's states (capture/checks.py) and verify's sample, without Redis."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capture.checks import check_states, post_norm_faults, pre_norm_faults
from capture.forward import States, TargetModel
from capture.verify import sample_rows
from common import errors
from tests.capture.helpers import build_model

IDS = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TargetModel:
    target = TargetModel(str(build_model(tmp_path_factory.mktemp("checks") / "m")))
    with torch.no_grad():  # a trained norm's weight is not all ones: the checks divide by it
        target._decoder.norm.weight.uniform_(0.2, 3.0)
    return target


def _states(model: TargetModel) -> States:
    return model.forward([IDS], (1, 3, 6))[0]


def test_good_states_pass_and_each_broken_one_fails_with_its_reason(model: TargetModel):
    good = _states(model)
    check_states(good, len(IDS))
    zero_aux = good.aux.clone()
    zero_aux[:, 1] = 0  # one layer all zeros (vLLM #46301)
    with pytest.raises(errors.BadStates, match="zero_state: aux 1 at token 0 \\(and 5 more\\)"):
        check_states(States(zero_aux, good.pre_norm, good.post_norm), len(IDS))
    flat = good.post_norm.clone()
    flat[2] = 0.5
    with pytest.raises(errors.BadStates, match="constant_state: final at token 2"):
        check_states(States(good.aux, good.pre_norm, flat), len(IDS))
    with pytest.raises(errors.BadStates, match="length: aux has 6 tokens, the row 7"):
        check_states(good, len(IDS) + 1)  # the server's tensors are a token short (#44485)
    nan = good.pre_norm.clone()
    nan[4, 3] = float("nan")
    with pytest.raises(errors.NonFinite, match="pre-norm final at token 4"):
        check_states(States(good.aux, nan, good.post_norm), len(IDS))


def test_the_final_norm_tells_a_post_norm_state_from_a_pre_norm_one(model: TargetModel):
    states = _states(model)
    norm = model._decoder.norm.weight.detach()
    assert post_norm_faults(states.post_norm, norm) == []
    assert [f.reason for f in post_norm_faults(states.pre_norm, norm)] == ["not_post_norm"]
    assert pre_norm_faults(states.pre_norm, norm) == []
    assert [f.reason for f in pre_norm_faults(states.post_norm, norm)] == ["post_norm_in_pre_slot"]
    half = norm.to(torch.bfloat16)  # rounding to bf16 keeps it within tolerance
    assert post_norm_faults(states.post_norm.to(torch.bfloat16), half) == []


def test_the_sample_is_a_share_of_the_rows_and_the_same_on_every_call(tmp_path: Path):
    rows = list(range(500))
    assert sample_rows(rows, 0) == set() and sample_rows(rows, 1.0) == set(rows)
    assert len(sample_rows(rows, 0.01)) == 5 and sample_rows(rows, 0.01) == sample_rows(rows, 0.01)
    assert len(sample_rows(rows[:10], 0.01)) == 1  # at least one row when asked for any
