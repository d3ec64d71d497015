"""Sampling parameters: unset ones not sent, one range check, one-line errors."""

from __future__ import annotations

import json
import math

import pytest

from common.errors import InvalidParams
from common.models import GenParams
from common.params import read_generation_config, validated
from common.sampling import describe
from common.unknown_settings import unknown_settings
from producer.enqueue import EnqueueCounts, reason_class
from producer.preflight import ServerLimits, check_max_tokens, prompt_estimate
from worker.chat.client import chat_body, completion_body

ASK = [{"role": "user", "content": "hi"}]


def test_unset_sampling_is_not_sent_so_the_servers_generation_config_applies():
    body = json.loads(chat_body("m", ASK, GenParams(), token_ids=False))
    assert not {"temperature", "top_p", "top_k", "min_p"} & set(body)
    assert body["max_tokens"] == 2048
    ids = json.loads(completion_body("m", [1, 2], GenParams(), 5))
    assert "temperature" not in ids and "top_p" not in ids


def test_greedy_and_other_given_values_are_sent_as_given():
    params = GenParams(temperature=0, top_p=0.95, top_k=20, min_p=0.0)
    body = json.loads(chat_body("m", ASK, params, token_ids=False))
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (0, 0.95, 20, 0)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"temperature": math.inf}, "temperature must be a finite number, not inf"),
        ({"temperature": math.nan}, "temperature must be a finite number, not nan"),
        ({"temperature": -0.1}, "temperature must be in [0, 2], not -0.1"),
        ({"top_p": 0}, "top_p must be in (0, 1], not 0"),
        ({"top_k": 0.5}, "top_k must be -1 (off) or a whole number >= 1, not 0.5"),
        ({"min_p": 2}, "min_p must be in [0, 1], not 2"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
    ],
)
def test_out_of_range_values_are_one_line(fields, expected):
    with pytest.raises(InvalidParams) as caught:
        validated(GenParams, fields)
    assert str(caught.value) == f"invalid generation parameters: {expected}"


def test_stored_json_is_checked_by_the_same_rule():
    with pytest.raises(InvalidParams, match="temperature must be in"):
        validated(GenParams, '{"max_tokens": 5, "temperature": 9}')


def test_a_generation_config_gives_the_values_vllm_applies(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos": 1}))
    assert read_generation_config(path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    shown = describe({"temperature": 0.6})
    assert shown["temperature"] == 0.6 and shown["top_p"] == "server default"


def test_max_tokens_that_leave_no_room_for_a_prompt_are_refused():
    with pytest.raises(InvalidParams, match="max_model_len 2048"):
        check_max_tokens(GenParams(max_tokens=100_000), ServerLimits(2048, []))
    check_max_tokens(GenParams(max_tokens=2000), ServerLimits(2048, []))
    check_max_tokens(GenParams(max_tokens=100_000), ServerLimits(None, ["x: down"]))


def test_the_prompt_estimate_is_a_token_a_word_plus_the_template():
    assert prompt_estimate("be brief", ["one two three"]) == 2 + 4 + 3 + 4
    assert prompt_estimate(None, ["a", "later turns are not counted"]) == 5


def test_the_summary_says_why_rows_were_skipped():
    counts = EnqueueCounts(enqueued=26, duplicates=24, invalid=2, rows=52)
    counts.reasons[reason_class("broken JSON (Expecting value at column 1)")] += 1
    counts.reasons[reason_class("message 3 is not an object")] += 1
    line = counts.line()
    assert line.startswith("enqueued 26, already present 0, duplicates 24, invalid 2 (read 52")
    assert "duplicates: the same prompt as an earlier row" in line
    assert "1 broken JSON" in line and "1 message N is not an object" in line


def test_an_unknown_variable_is_named_with_the_closest_setting():
    line = unknown_settings({"EAGLEGEN_ENDPOINT": "x", "EAGLEGEN_RUN": "r", "PATH": "/"})
    assert line == (
        "warning: ignored, no such setting: EAGLEGEN_ENDPOINT (did you mean EAGLEGEN_ENDPOINTS?)"
    )
    assert unknown_settings({"EAGLEGEN_TEST_REDIS_URL": "x", "EAGLEGEN_RUN": "r"}) is None
