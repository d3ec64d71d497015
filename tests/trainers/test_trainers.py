"""SpecForge 0.2.0 and speculators 0.9.0 read `eaglegen export` output with their own code.

The records (tests/fixtures/trainers/records.jsonl) come from the real pipeline
(tests/trainers/build_fixture.sh: simulator, worker, collector, the bundled prompts): reasoning
in every turn, two-turn MT-Bench conversations, thinking off with a system prompt, and turns cut
at ``max_tokens``. EagleGen tokenizes them with a Qwen3 tokenizer built locally and exports;
tests/trainers/peer_rows.py then runs, in the trainers' own venv, SpecForge's
``prepare_prompt_tasks`` (pre-tokenized JSONL and conversations), speculators' ``ArrowDataset``
and ``CollateFn`` (its trainer's loader) and ``build_speculator_training_dataset`` (its
preprocessing), and both vocabulary loaders and builders.

Every row a peer produces must equal EagleGen's, or differ only for a documented cause
(docs/trainers.md), each named and counted:

- ``eot_newline``: the peer also trains on the newline after ``<|im_end|>``, which the template
  adds and the model never generates.
- ``cut_turn_end``: a turn cut at ``max_tokens``; the peer trains on the closing text the
  template appends (``</think>``, ``<|im_end|>``), which the model never generated.
- ``think_scaffold``: thinking off; the peer trains on the empty think block the template put
  in the prompt (``<think>\\n\\n</think>\\n\\n``), which the model was given, not generated.

In each case EagleGen's row is the right one: it masks exactly what the model generated.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch

from tests.training.helpers import quiet
from tests.training.local_tokenizers import cached_tokenizer
from training.export import export
from training.tokenize import tokenize
from training.vocab import count_masked

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "tests" / "fixtures" / "trainers" / "records.jsonl"
DRIVER = Path(__file__).resolve().parent / "peer_rows.py"
CAUSES = ("eot_newline", "cut_turn_end", "think_scaffold")


def trainers_python() -> Path:
    """Return the trainers' venv Python, or skip (locally) / fail (CI) with the reason."""
    venv = Path(os.environ.get("EAGLEGEN_TRAINERS_VENV", ROOT / ".trainers-venv"))
    python = venv / "bin" / "python"
    if (venv / ".eaglegen-installed").exists() and python.exists():
        return python
    failed = ROOT / ".eaglegen" / "trainers-setup.failed"
    why = failed.read_text().strip() if failed.exists() else "run scripts/setup_trainers.sh"
    message = f"trainers' venv not set up at {venv}: {why}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tokenize and export the fixture, run the peers on it; return everything compared."""
    return peer_run(RECORDS, tmp_path_factory.mktemp("trainers"))


def peer_run(records: Path, tmp: Path) -> dict[str, Any]:
    """Tokenize and export ``records`` with a Qwen3 tokenizer, run the peers on the export."""
    python = trainers_python()
    tok = cached_tokenizer("qwen3")
    tok.save_pretrained(str(tmp / "tokenizer"))
    stats = tokenize(records, tok, tmp / "tokenized", **quiet())
    draft = tied_draft_size(tmp / "tokenized" / "dataset")
    export(tmp / "tokenized", tmp / "export", draft_vocab_size=draft)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "HF_HOME": str(tmp / "hf")}
    env |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [str(tmp / "export"), str(tmp / "tokenizer"), str(draft)]
    args += [str(stats.target_vocab_size), str(tmp / "peers.json")]
    done = subprocess.run(
        [str(python), str(DRIVER), *args], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(datasets.load_from_disk(str(tmp / "tokenized" / "dataset")))
    lines = (tmp / "export" / "specforge" / "conversations.jsonl").read_text().splitlines()
    meta = {row["id"]: row for row in map(json.loads, lines)}
    peers = json.loads((tmp / "peers.json").read_text())
    mapping = torch.load(tmp / "export" / "specforge" / "vocab_mapping.pt", weights_only=True)
    return {"rows": rows, "meta": meta, "peers": peers, "mapping": mapping, "tok": tok} | {
        "draft": draft
    }


def tied_draft_size(dataset: Path) -> int:
    """Return the smallest draft size from 32 whose last id ties with the first one left out."""
    counts, _, _ = count_masked(dataset)
    ranked = sorted(counts[counts > 0].tolist(), reverse=True)
    return next(n for n in range(32, len(ranked)) if ranked[n - 1] == ranked[n])


def causes(eagle: dict[str, Any], peer: dict[str, Any], meta: dict[str, Any], tok: Any) -> set[str]:
    """Name why a peer's row differs from EagleGen's ({"equal"} if it does not)."""
    ids, mask = list(peer["ids"]), list(peer["mask"])
    found = set()
    newline = tok.encode("\n", add_special_tokens=False)
    if ids == eagle["input_ids"] + newline and mask[-1] == 1:
        found.add("eot_newline")
        ids, mask = ids[: -len(newline)], mask[: -len(newline)]
    if ids != eagle["input_ids"]:
        return {"unexplained: token ids differ"}
    ours = eagle["loss_mask"]
    last = max(i for i, m in enumerate(ours) if m)
    diff = [i for i, (a, b) in enumerate(zip(ours, mask, strict=True)) if a != b]
    after = [i for i in diff if i > last]
    before = [i for i in diff if i <= last]
    if after and meta["finish_reason"] == "length" and all(mask[i] for i in after):
        found.add("cut_turn_end")
    elif after:
        return {"unexplained: extra masked tail"}
    scaffold = tok.decode([ids[i] for i in before]) == "<think>\n\n</think>\n\n"
    if (
        before
        and meta.get("enable_thinking") is False
        and scaffold
        and all(mask[i] for i in before)
    ):
        found.add("think_scaffold")
    elif before:
        return {"unexplained: mask differs inside the row"}
    return found or {"equal"}


def compare(run: dict[str, Any], route: str, by_key: bool) -> Counter[str]:
    """Return how many rows of a route are equal and how many differ by each cause."""
    rows, peers = run["rows"], run["peers"][route]
    assert len(peers) == len(rows), f"{route}: {len(peers)} rows, EagleGen wrote {len(rows)}"
    index = {r["id"]: r for r in rows}
    tally: Counter[str] = Counter()
    for k, peer in enumerate(peers):
        eagle = index[peer["key"]] if by_key else rows[k]
        for cause in causes(eagle, peer, run["meta"][eagle["id"]], run["tok"]):
            tally[cause] += 1
    report(route, len(rows), tally)
    return tally


def report(route: str, compared: int, tally: Counter[str]) -> None:
    """Print the route's figures and keep them in .eaglegen/trainers-report.json."""
    print(f"{route}: {compared} rows compared, {dict(sorted(tally.items()))}")
    path = ROOT / ".eaglegen" / "trainers-report.json"
    path.parent.mkdir(exist_ok=True)
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[route] = {"compared": compared, **tally}
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def expected(run: dict[str, Any]) -> dict[str, int]:
    """Count the fixture's rows that end in a cut turn or were generated with thinking off."""
    meta = run["meta"].values()
    return {
        "rows": len(run["rows"]),
        "cut": sum(m["finish_reason"] == "length" for m in meta),
        "nothink": sum(m.get("enable_thinking") is False for m in meta),
    }


def test_fixture_covers_reasoning_thinking_off_cut_turns_and_multi_turn(run):
    meta = list(run["meta"].values())
    n = expected(run)
    assert n["cut"] >= 10 and n["nothink"] >= 20
    assert sum(any("reasoning_content" in m for m in r["conversations"]) for r in meta) >= 100
    assert sum(r["id"].endswith("-t1") for r in meta) >= 40
    assert all(r["status"] == "success" for r in meta)


def test_specforge_reads_the_pretokenized_jsonl_as_eaglegen_wrote_it(run):
    tally = compare(run, "specforge_jsonl", by_key=True)
    assert tally == {"equal": len(run["rows"])}


def test_speculators_trainer_batches_eaglegens_rows_unchanged(run):
    tally = compare(run, "speculators_dataset", by_key=False)
    assert tally == {"equal": len(run["rows"])}


def test_specforge_preprocessing_of_the_conversations_differs_only_by_documented_causes(run):
    tally = compare(run, "specforge_conversations", by_key=True)
    n = expected(run)
    assert set(tally) <= {"equal", *CAUSES}, tally
    assert tally["eot_newline"] == n["rows"]
    assert tally["cut_turn_end"] == n["cut"] and tally["think_scaffold"] == n["nothink"]


def test_speculators_preprocessing_of_the_conversations_differs_only_by_documented_causes(run):
    tally = compare(run, "speculators_conversations", by_key=False)
    n = expected(run)
    assert set(tally) <= {"equal", *CAUSES}, tally
    assert tally["eot_newline"] == n["rows"]
    assert tally["cut_turn_end"] == n["cut"] and tally["think_scaffold"] == n["nothink"]


def test_both_vocab_loaders_read_eaglegens_mapping(run):
    vocab = run["peers"]["vocab"]
    ours = [int(v) + i for i, v in enumerate(run["mapping"]["d2t"].tolist())]
    assert vocab["specforge_loaded"] == ours and vocab["speculators_loaded"] == ours
    assert vocab["speculators_loaded_t2d"] == ours and vocab["speculators_size"] == run["draft"]


def test_speculators_builds_the_same_vocabulary_and_specforge_differs_only_on_ties(run):
    vocab = run["peers"]["vocab"]
    ours = [int(v) + i for i, v in enumerate(run["mapping"]["d2t"].tolist())]
    assert vocab["speculators_own"] == ours
    counts = {int(k): v for k, v in vocab["counts"].items()}
    draft = run["draft"]
    cutoff = sorted(counts.values(), reverse=True)[draft - 1]
    differ = set(vocab["specforge_own"]) ^ set(ours)
    assert all(counts.get(i, 0) == cutoff for i in differ), "SpecForge differs beyond ties"
    tally = Counter({"equal": draft - len(differ) // 2, "tie_order": len(differ) // 2})
    report("specforge_vocab_ids", draft, tally)
