import json

import pytest

from collector.sink import JsonlSink
from common.errors import ConfigError
from common.redact import redact, redact_url
from common.settings import Settings


def _line(i, run="r"):
    return json.dumps({"schema": 1, "id": f"id{i}", "run": run, "x": i})


def test_a_partial_last_line_is_cut_on_open(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(_line(1) + "\n" + _line(2)[:7])
    sink = JsonlSink(path, "r")
    sink.close()
    assert path.read_text() == _line(1) + "\n"
    assert sink.ids == {"id1"} and sink.repaired_bytes == 7


def test_a_file_of_another_run_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(_line(1, run="a") + "\n" + _line(2, run="a")[:9])
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="holds records of run 'a', not 'b'"):
        JsonlSink(path, "b")
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "content", [b"id,text\n1,hello\n2,no newline at the end", b'{"id": 1}\n', b"\x00\x01binary"]
)
def test_a_file_that_is_not_eaglegen_output_is_refused_byte_for_byte(tmp_path, content):
    path = tmp_path / "notes.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not an EagleGen output file"):
        JsonlSink(path, "r")
    assert path.read_bytes() == content


def test_a_first_line_cut_by_a_crash_is_ours_and_repaired(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(_line(1)[:20])
    JsonlSink(path, "r").close()
    assert path.read_bytes() == b""


def test_a_folder_as_out_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        JsonlSink(tmp_path, "r")


def test_a_second_sink_on_the_same_file_is_refused_while_the_first_is_open(tmp_path):
    path = tmp_path / "out.jsonl"
    first = JsonlSink(path, "r")
    with pytest.raises(ConfigError, match="open in another collector"):
        JsonlSink(path, "r")
    first.close()
    JsonlSink(path, "r").close()


def test_ids_already_in_the_file_are_not_written_again(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(path, "r")
    assert sink.append([("id1", _line(1)), ("id2", _line(2))]) == 2
    sink.close()
    sink = JsonlSink(path, "r")
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
