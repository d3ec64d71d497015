"""The collector's id index: a restart reads only new lines, and stays right whatever the index.

Real files in a temporary folder. A probe shows what was read: an early line rewritten in place
(same length, another id) is seen only by a full scan.
"""

import json

from collector.sink import JsonlSink


def _line(i, run="r"):
    return json.dumps({"schema": 1, "id": f"id{i:07d}", "run": run, "x": i})


def _write(path, ids, run="r"):
    sink = JsonlSink(path, run)
    sink.append([(f"id{i:07d}", _line(i, run)) for i in ids])
    sink.close()


def _probe(path):
    """Rename the first line's id in the file only: a full scan would find 'xx0000000'."""
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"id0000000"', b'"xx0000000"', 1))


def _index(path):
    return path.with_name(path.name + ".ids")


def test_a_restart_takes_the_ids_from_the_index_and_scans_only_newer_lines(tmp_path):
    path = tmp_path / "out.jsonl"
    _write(path, range(100))
    _probe(path)
    with path.open("ab") as fh:  # lines fsynced by a collector that died before its index
        fh.write(("\n".join(_line(i) for i in range(100, 110)) + "\n").encode())
    sink = JsonlSink(path, "r")
    assert "id0000000" in sink.ids and "xx0000000" not in sink.ids  # not rescanned
    assert {f"id{i:07d}" for i in range(100, 110)} <= sink.ids and len(sink.ids) == 110
    assert sink.scanned_bytes == sum(len(_line(i)) + 1 for i in range(100, 110))
    assert sink.append([("id0000105", _line(105)), ("id0000200", _line(200))]) == 1
    sink.close()
    again = JsonlSink(path, "r")
    assert again.scanned_bytes == 0 and len(again.ids) == 111
    again.close()


def test_a_missing_index_means_one_full_scan_and_a_new_index(tmp_path):
    path = tmp_path / "out.jsonl"
    _write(path, range(50))
    _index(path).unlink()
    _probe(path)
    sink = JsonlSink(path, "r")
    assert "xx0000000" in sink.ids and sink.scanned_bytes == path.stat().st_size
    sink.close()
    again = JsonlSink(path, "r")
    assert again.scanned_bytes == 0
    again.close()


def test_an_index_longer_than_a_cut_file_falls_back_to_what_the_file_holds(tmp_path):
    path = tmp_path / "out.jsonl"
    for batch in (range(0, 10), range(10, 20), range(20, 30)):
        _write(path, batch)
    keep = sum(len(_line(i)) + 1 for i in range(15))  # cut mid-batch: the file was replaced
    path.write_bytes(path.read_bytes()[:keep])
    sink = JsonlSink(path, "r")
    assert sink.ids == {f"id{i:07d}" for i in range(15)}
    sink.close()


def test_an_index_of_another_file_is_not_trusted(tmp_path):
    path = tmp_path / "out.jsonl"
    _write(path, range(20))
    other = tmp_path / "other.jsonl"
    _write(other, range(100, 140))  # longer, so every checkpoint fits the file
    _index(other).write_bytes(_index(path).read_bytes())
    sink = JsonlSink(other, "r")
    assert sink.ids == {f"id{i:07d}" for i in range(100, 140)}
    sink.close()


def test_a_torn_index_tail_is_dropped(tmp_path):
    path = tmp_path / "out.jsonl"
    _write(path, range(10))
    with _index(path).open("ab") as fh:
        fh.write(b"id0000999\nid00")  # a batch whose checkpoint never came
    sink = JsonlSink(path, "r")
    assert sink.ids == {f"id{i:07d}" for i in range(10)}
    sink.close()
    assert b"id0000999" not in _index(path).read_bytes()


def test_start_up_on_a_200k_line_file_with_its_index_reads_no_line(tmp_path):
    # Reads nothing of the file but its last line: the time it takes is measured by
    # bench/collector_startup.py (0.31 s at 1M lines of 1 KB), not asserted here.
    path = tmp_path / "out.jsonl"
    _write(path, range(200_000))
    sink = JsonlSink(path, "r")
    assert sink.scanned_bytes == 0 and len(sink.ids) == 200_000
    sink.close()
