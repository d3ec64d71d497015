import json

import pytest

from collector.sink import JsonlSink
from common.redact import redact, redact_url
from common.settings import Settings


def _line(i):
    return json.dumps({"id": f"id{i}", "x": i})


def test_a_partial_last_line_is_cut_on_open(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(_line(1) + "\n" + _line(2)[:7])
    sink = JsonlSink(path)
    sink.close()
    assert path.read_text() == _line(1) + "\n"
    assert sink.ids == {"id1"} and sink.repaired_bytes == 7


def test_ids_already_in_the_file_are_not_written_again(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(path)
    assert sink.append([("id1", _line(1)), ("id2", _line(2))]) == 2
    sink.close()
    sink = JsonlSink(path)
    assert sink.append([("id2", _line(2)), ("id3", _line(3)), ("id3", _line(3))]) == 1
    sink.close()
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == ["id1", "id2", "id3"]


def test_endpoints_are_split_on_commas_and_checked(monkeypatch):
    monkeypatch.setenv("EAGLEGEN_ENDPOINTS", "http://a:1/v1, http://b:2/v1/")
    assert Settings().endpoints == ["http://a:1/v1", "http://b:2/v1"]
    with pytest.raises(ValueError, match="ending in /v1"):
        Settings(endpoints="http://a:1")


def test_run_names_must_be_key_safe():
    with pytest.raises(ValueError, match="run name"):
        Settings(run="a b")


def test_the_visibility_timeout_outlasts_a_turn_and_its_backoff():
    s = Settings(max_request_time=100, backoff_max=50)
    assert s.effective_visibility_timeout > 150
    assert Settings(visibility_timeout=7).effective_visibility_timeout == 7


def test_the_api_key_never_shows_in_the_settings_repr():
    s = Settings(api_key="sk-very-secret")
    assert "sk-very-secret" not in repr(s) and s.api_key_value() == "sk-very-secret"


def test_passwords_and_secrets_are_redacted():
    assert redact_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact_url("rediss://:pw@h:1") == "rediss://:***@h:1"
    assert redact("key sk-abcdef used", ["sk-abcdef"]) == "key *** used"
