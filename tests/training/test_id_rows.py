"""Rows from the server's token ids: grouping, the template cross-check, --source, export."""

from __future__ import annotations

import json

import datasets
import pytest

from simulator.tokenizer import KEY, WORD_IDS
from tests.training.helpers import quiet, write_jsonl
from tests.training.sim_records import sim_record, sim_tokenizer
from training.export import export
from training.id_rows import id_rows
from training.records import RecordError, parse_record
from training.tokenize import tokenize

QUESTIONS = ["What is the capital of France?", "And of Spain? Answer in one word, s'il vous plaît."]


def run(tmp_path, rows, name="out", **options):
    """Tokenize rows with the simulator's tokenizer; return (stats, dataset rows, printed)."""
    source = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    kw = quiet() | options
    stats = tokenize(source, sim_tokenizer(), tmp_path / name, **kw)
    out = list(datasets.load_from_disk(str(tmp_path / name / "dataset")))
    return stats, out, kw["console"].file.getvalue()


def records() -> list[dict]:
    return [
        sim_record("one", QUESTIONS[:1]),
        sim_record("two", QUESTIONS),
        sim_record("plain", QUESTIONS, thinking=False),
    ]


def test_rows_from_ids_are_the_template_rows_on_the_simulators_own_tokenizer(tmp_path):
    from_ids, id_rows_out, printed = run(tmp_path, records(), "ids", source="ids")
    rendered, template_rows, _ = run(tmp_path, records(), "tpl", source="template")
    assert (from_ids.rows_from_ids, from_ids.drift_checks, from_ids.drift_rows) == (5, 5, 0)
    assert rendered.rows_from_ids == 0 and rendered.drift_checks == 0
    assert id_rows_out == template_rows  # ids, masks and row ids
    assert [r["id"] for r in id_rows_out] == ["one", "two-t0", "two-t1", "plain-t0", "plain-t1"]
    assert "rows from ids unlike the template" in printed and "warning" not in printed


def test_a_row_from_ids_trains_on_exactly_the_generated_ids(tmp_path):
    record = sim_record("two", QUESTIONS)
    _, rows, _ = run(tmp_path, [record], source="ids")
    for row, turn in zip(rows, record["generation"]["turns"], strict=True):
        prompt, completion = turn["prompt_token_ids"], turn["token_ids"]
        assert row["input_ids"] == prompt + completion
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(completion)


@pytest.mark.parametrize("max_tokens", [3, 40])  # cut in the reasoning, cut in the answer
def test_a_turn_cut_by_length_has_no_drift_and_ends_where_generation_did(tmp_path, max_tokens):
    record = sim_record("cut", QUESTIONS, max_tokens=max_tokens)
    stats, [row], _ = run(tmp_path, [record], source="ids")
    assert stats.drift_rows == 0 and record["generation"]["turns"][0]["finish_reason"] == "length"
    assert len(row["input_ids"]) == stats.tokens and row["loss_mask"][-1] == 1
    assert sum(row["loss_mask"]) == max_tokens


def test_a_row_unlike_the_template_is_counted_and_shown_decoded_on_both_sides(tmp_path):
    record = sim_record("drift", QUESTIONS[:1])
    ids = record["generation"]["turns"][0]["token_ids"]
    at = ids.index(KEY) + 1
    ids[at] = WORD_IDS[" zulu"] if ids[at] != WORD_IDS[" zulu"] else WORD_IDS[" alpha"]
    stats, [row, _], printed = run(tmp_path, [record, sim_record("fine", QUESTIONS[:1])])
    assert (stats.drift_checks, stats.drift_rows) == (2, 1)
    [example] = stats.drift_examples
    prompt = len(record["generation"]["turns"][0]["prompt_token_ids"])
    assert (example["id"], example["what"], example["position"]) == ("drift", "token", prompt + at)
    assert "⟦" in example["ids"] and example["ids"] != example["template"]
    assert row["input_ids"][prompt + at] == ids[at]  # the server's ids are what trains
    assert "1 of 2 rows from token ids differ from the template's" in " ".join(printed.split())
    saved = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert saved["drift_rows"] == 1 and saved["options"]["source"] == "auto"


def test_source_ids_skips_records_without_ids_and_auto_renders_them(tmp_path):
    bare = sim_record("bare", QUESTIONS[:1])
    for turn in bare["generation"]["turns"]:
        del turn["prompt_token_ids"], turn["token_ids"]
    only, rows, _ = run(tmp_path, [bare, sim_record("ids", QUESTIONS[:1])], "a", source="ids")
    assert only.bad_rows == 1 and "no token ids" in only.bad_examples[0]["reason"]
    assert [r["id"] for r in rows] == ["ids"]
    auto, rows, _ = run(tmp_path, [bare, sim_record("ids", QUESTIONS[:1])], "b")
    assert (auto.rows_out, auto.rows_from_ids, auto.drift_checks) == (2, 1, 1)


def test_malformed_ids_make_a_bad_row():
    record = sim_record("x", QUESTIONS[:1])
    record["generation"]["turns"][0]["token_ids"] = [1, "two"]
    with pytest.raises(RecordError, match="token ids"):
        parse_record(record)


def chained(later_prompt: list[int]) -> dict:
    """A two-turn record whose second prompt is given (ids only matter here)."""
    turns = [
        {"finish_reason": "stop", "prompt_token_ids": [1, 2], "token_ids": [3, 4]},
        {"finish_reason": "stop", "prompt_token_ids": later_prompt, "token_ids": [6]},
    ]
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 2
    return {"id": "c", "conversations": conversation, "generation": {"turns": turns}}


def test_a_later_prompt_that_repeats_the_earlier_turn_makes_one_row_trained_on_both():
    record = parse_record(chained([1, 2, 3, 4, 5]))
    [row], unmasked = id_rows(record, "auto")
    assert (list(row.ids), list(row.mask), row.turns, unmasked) == (
        [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1], (0, 1), 0,
    )  # fmt: skip
    assert row.cuts == ((0, 4),)
    assert [r.last for r in id_rows(record, "always")[0]] == [0, 1]


def test_a_later_prompt_that_rewrites_the_earlier_turn_splits_or_leaves_it_untrained():
    record = parse_record(chained([1, 2, 9, 5]))
    assert [r.last for r in id_rows(record, "auto")[0]] == [0, 1]
    [row], unmasked = id_rows(record, "never")
    assert (list(row.mask), unmasked) == ([0, 0, 0, 0, 1], 1)


def test_cut_at_a_turn_and_export_work_on_rows_from_ids(tmp_path):
    record = chained([1, 2, 3, 4, 5])
    stats, [row], _ = run(tmp_path, [record], max_length=5, truncate="turn", per_turn="auto")
    assert (row["input_ids"], row["loss_mask"], stats.cut_rows) == ([1, 2, 3, 4], [0, 0, 1, 1], 1)
    result = export(tmp_path / "out", tmp_path / "export")
    assert result.rows == 1
    line = json.loads((tmp_path / "export" / "specforge" / "train.jsonl").read_text())
    assert line["input_ids"] == [1, 2, 3, 4]
