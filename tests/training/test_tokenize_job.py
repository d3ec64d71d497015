"""The tokenize job end to end: outputs, length policies, bad rows, checks, processes, CLI."""

from __future__ import annotations

import json

import datasets
import pytest
import typer
from typer.testing import CliRunner

from tests.training.helpers import masked_runs, quiet, write_jsonl
from tests.training.local_tokenizers import cached_tokenizer
from training import cli, sink
from training.render import TemplateError
from training.tokenize import tokenize


def conversation(rid, turns=1, finish=None, prompt_tokens=None, reasoning="Let me think."):
    """Return a record with `turns` user/assistant turns and optional per-turn metadata."""
    conv = [{"role": "system", "content": "Be brief."}]
    meta = []
    for k in range(turns):
        conv.append({"role": "user", "content": f"Question number {k}: what is the value?"})
        conv.append(
            {"role": "assistant", "content": f"The value is {k}.", "reasoning_content": reasoning}
        )
        usage = {"prompt_tokens": prompt_tokens[k]} if prompt_tokens else {}
        meta.append({"finish_reason": (finish or ["stop"] * turns)[k], "usage": usage})
    return {"schema": 1, "id": rid, "conversations": conv, "generation": {"turns": meta}}


def run(tmp_path, rows, family="qwen3", **options):
    """Tokenize rows with a family's tokenizer; return (stats, dataset rows, printed text)."""
    write_jsonl(tmp_path / "in.jsonl", rows)
    kw = quiet() | options
    stats = tokenize(tmp_path / "in.jsonl", cached_tokenizer(family), tmp_path / "out", **kw)
    out = list(datasets.load_from_disk(str(tmp_path / "out" / "dataset")))
    return stats, out, kw["console"].file.getvalue()


def test_outputs_are_a_dataset_specforge_conversations_and_stats(tmp_path):
    _, rows, printed = run(tmp_path, [conversation("a", turns=2)])
    assert [r["id"] for r in rows] == ["a-t0", "a-t1"]
    assert set(rows[0]) == {"id", "input_ids", "loss_mask"}
    lines = (tmp_path / "out" / "conversations.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["id"] == "a-t0" and [m["role"] for m in first["conversations"]][-1] == "assistant"
    assert first["conversations"][-1]["reasoning_content"] == "Let me think."
    saved = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert saved["rows_out"] == 2 and saved["tokenizer_vocab_size"] == len(
        cached_tokenizer("qwen3")
    )
    assert saved["masked_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    assert "rows out" in printed


def test_bad_rows_are_counted_with_their_line_numbers_and_skipped(tmp_path):
    rows = [
        conversation("ok"),
        "{broken",
        "",
        {"id": "x", "conversations": [{"role": "user", "content": "q"}]},
    ]
    stats, out, printed = run(tmp_path, rows)
    assert stats.bad_rows == 2 and len(out) == 1
    assert [b["line"] for b in stats.bad_examples] == [2, 4]
    assert "2 bad rows skipped" in printed


def test_an_assistant_message_that_lost_its_answer_is_a_bad_row_named_by_its_line(tmp_path):
    lost = conversation("lost", turns=2)
    lost["conversations"][2]["content"] = None  # no tool calls either
    calls = conversation("calls")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    calls["conversations"][2] |= {"content": None, "tool_calls": [call]}
    stats, out, printed = run(tmp_path, [conversation("ok"), lost, calls])
    assert stats.bad_rows == 1
    assert stats.bad_examples == [
        {"line": 2, "reason": "message 2 is an assistant message without content"}
    ]
    assert {r["id"].split("-")[0] for r in out} == {"ok", "calls"}
    assert "1 bad rows skipped (line 2: message 2 is an assistant" in printed


@pytest.mark.parametrize("finish", [["abort"], ["stop", "abort"], ["abort", "stop"], ["error"]])
def test_a_record_with_a_turn_that_did_not_finish_gives_no_training_row(tmp_path, finish):
    broken = conversation("broken", turns=len(finish), finish=finish)
    stats, out, _ = run(tmp_path, [conversation("ok"), broken], on_length="drop")
    assert [r["id"] for r in out] == ["ok"]
    assert stats.bad_rows == 1 and stats.bad_examples[0]["line"] == 2
    assert "did not finish (finish_reason" in stats.bad_examples[0]["reason"]


def test_a_repeated_id_is_written_once(tmp_path):
    stats, out, _ = run(tmp_path, [conversation("a"), conversation("a")])
    assert stats.duplicates == 1 and len(out) == 1


def test_prompt_token_mismatches_are_counted_and_reported_with_ids(tmp_path):
    stats, _, printed = run(tmp_path, [conversation("off", prompt_tokens=[3])])
    assert (stats.prompt_checks, stats.prompt_mismatches) == (1, 1)
    assert stats.mismatch_examples[0]["id"] == "off" and "off (turn 0)" in printed


def test_rows_over_max_length_are_dropped_and_counted(tmp_path):
    stats, out, _ = run(tmp_path, [conversation("a", turns=2)], family="llama3_1", max_length=60)
    assert out == [] and stats.dropped == {"too_long": 1}


def test_truncate_turn_cuts_a_row_after_the_last_turn_that_fits(tmp_path):
    tok = cached_tokenizer("llama3_1")
    record = conversation("a", turns=2)
    first = tok.apply_chat_template(record["conversations"][:3], tokenize=True, return_dict=False)
    limit = len(first) + 5
    stats, out, _ = run(tmp_path, [record], family="llama3_1", max_length=limit, truncate="turn")
    (row,) = out
    assert row["input_ids"] == first and len(masked_runs(row["loss_mask"])) == 1
    assert stats.cut_rows == 1
    conv = json.loads((tmp_path / "out" / "conversations.jsonl").read_text())
    assert len(conv["conversations"]) == 3


def test_a_per_turn_row_over_max_length_has_no_turn_to_cut_at_and_is_dropped(tmp_path):
    stats, out, _ = run(tmp_path, [conversation("a")], max_length=10, truncate="turn")
    assert out == [] and stats.dropped == {"too_long": 1}


@pytest.mark.parametrize(
    ("policy", "ids"), [("keep", ["a", "b"]), ("drop", ["b"]), ("flag", ["a", "b"])]
)
def test_length_finished_rows_are_kept_dropped_or_flagged(tmp_path, policy, ids):
    rows = [conversation("a", finish=["length"]), conversation("b")]
    stats, out, _ = run(tmp_path, rows, on_length=policy)
    assert [r["id"] for r in out] == ids
    if policy == "flag":
        assert [r["truncated"] for r in out] == [True, False] and stats.flagged_truncated == 1
    else:
        assert "truncated" not in out[0]


def test_a_length_cut_turn_does_not_train_on_closing_tokens_it_never_generated(tmp_path):
    _, out, _ = run(tmp_path, [conversation("a", finish=["length"])])
    tok = cached_tokenizer("qwen3")
    ((a, b),) = masked_runs(out[0]["loss_mask"])
    assert tok.decode(out[0]["input_ids"][a:b]).endswith("The value is 0.")


def test_never_keeps_one_row_and_counts_turns_it_cannot_train_on(tmp_path):
    stats, out, _ = run(tmp_path, [conversation("a", turns=3)], per_turn="never")
    assert [r["id"] for r in out] == ["a"] and stats.unmasked_turns == 2


def test_a_template_that_breaks_the_prefix_property_fails_in_one_line_naming_it(tmp_path):
    bad = tmp_path / "odd.jinja"
    bad.write_text(
        "{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match=r"odd\.jinja.*line 1, id a") as err:
        run(tmp_path, [conversation("a", reasoning=None)], family="llama3_1", chat_template=bad)
    assert "\n" not in str(err.value)


def test_an_input_without_usable_rows_gives_an_empty_dataset(tmp_path):
    stats, out, _ = run(tmp_path, ["not json"])
    assert out == [] and stats.rows_out == 0 and stats.bad_rows == 1


def test_two_processes_write_the_same_rows_in_the_same_order(tmp_path):
    rows = [conversation(f"r{i}", turns=1 + i % 3) for i in range(40)]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _, one, _ = run(tmp_path / "a", rows, chunk_lines=4)
    _, two, _ = run(tmp_path / "b", rows, num_proc=2, chunk_lines=4)
    assert one == two and len(one) == sum(1 + i % 3 for i in range(40))


def cli_app():
    """Return a Typer app with the training commands registered."""
    app = typer.Typer()

    @app.callback()
    def main():
        """EagleGen."""

    cli.register(app)
    return app


def test_the_cli_tokenizes_and_builds_the_vocab_map(tmp_path):
    tok_dir = tmp_path / "tok"
    cached_tokenizer("qwen3").save_pretrained(str(tok_dir))
    write_jsonl(tmp_path / "in.jsonl", [conversation("a", turns=2)])
    runner = CliRunner()
    out = tmp_path / "out"
    args = ["tokenize", str(tmp_path / "in.jsonl"), "--tokenizer", str(tok_dir), "--out", str(out)]
    result = runner.invoke(cli_app(), [*args, "--no-progress", "--finish-length", "flag"])
    assert result.exit_code == 0, result.output
    assert "truncated" in datasets.load_from_disk(str(out / "dataset")).column_names
    vm = ["vocab-map", str(out), "--draft-vocab-size", "32", "--out", str(tmp_path / "vm.pt")]
    result = runner.invoke(cli_app(), vm)
    assert result.exit_code == 0 and "mapping written" in result.output


def test_the_cli_reports_a_bad_option_in_one_line(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [conversation("a")])
    args = ["tokenize", str(tmp_path / "in.jsonl"), "--tokenizer", "x", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli_app(), [*args, "--per-turn", "sometimes"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        "error: per_turn must be auto, always or never"
    ]


def test_the_cli_names_the_train_extra_when_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None)
    result = CliRunner().invoke(
        cli_app(), ["vocab-map", str(tmp_path), "--draft-vocab-size", "2", "--out", "x"]
    )
    assert result.exit_code == 1
    assert "install the train extra: pip install -e '.[train]'" in result.output


def test_a_dataset_written_in_several_arrow_shards_loads_whole_and_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(sink, "SHARD_BYTES", 2000)
    rows = [conversation(f"r{i}") for i in range(30)]
    _, out, _ = run(tmp_path, rows, chunk_lines=4)
    assert len(list((tmp_path / "out" / "dataset").glob("data-*.arrow"))) > 1
    assert [r["id"] for r in out] == [f"r{i}" for i in range(30)]
    features = datasets.load_from_disk(str(tmp_path / "out" / "dataset")).features
    assert str(features["input_ids"].feature.dtype) == "int32"
    assert str(features["loss_mask"].feature.dtype) == "int8"


def test_a_conversation_the_template_refuses_is_a_bad_row_not_a_crash(tmp_path):
    row = conversation("a")
    row["conversations"][-1]["tool_calls"] = [{"function": {"name": "f", "arguments": {}}}] * 2
    stats, out, _ = run(tmp_path, [row, conversation("b")], family="llama3_1")
    assert [r["id"] for r in out] == ["b"]
    assert "only supports single tool-calls" in stats.bad_examples[0]["reason"]


def test_a_previous_output_is_replaced_but_a_foreign_directory_is_not(tmp_path):
    run(tmp_path, [conversation("a")])
    _, out, _ = run(tmp_path, [conversation("b")])
    assert [r["id"] for r in out] == ["b"]
    (tmp_path / "out" / "dataset" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not overwriting"):
        run(tmp_path, [conversation("c")])
