"""The draft vocabulary mapping against a brute-force count, and the stale-mapping rule."""

from __future__ import annotations

import json
import random
from collections import Counter

import datasets
import pytest
import torch

from training.vocab import build_mapping, vocab_map


def save_rows(root, rows, target_vocab_size=None):
    """Save (input_ids, loss_mask) rows as a tokenize-style output dir; return the dir."""
    data = {
        "id": [f"r{i}" for i in range(len(rows))],
        "input_ids": [ids for ids, _ in rows],
        "loss_mask": [mask for _, mask in rows],
    }
    datasets.Dataset.from_dict(data).save_to_disk(str(root / "dataset"))
    if target_vocab_size is not None:
        (root / "stats.json").write_text(json.dumps({"target_vocab_size": target_vocab_size}))
    return root


def random_rows(seed, n=40, vocab=50):
    """Return rows of skewed random ids with random masks (ties are likely)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = rng.randint(1, 30)
        ids = [min(int(rng.expovariate(0.15)), vocab - 1) for _ in range(length)]
        rows.append((ids, [rng.randint(0, 1) for _ in range(length)]))
    return rows


def brute_force(rows, draft, target):
    """The reference algorithm, written as plainly as possible."""
    counts = Counter(i for ids, mask in rows for i, m in zip(ids, mask, strict=True) if m == 1)
    top = sorted(counts, key=lambda i: (-counts[i], i))[:draft]
    unused = [i for i in range(target) if i not in top]
    used = sorted(top + unused[: draft - len(top)])
    d2t = [u - i for i, u in enumerate(used)]
    t2d = [i in used for i in range(target)]
    return d2t, t2d


@pytest.mark.parametrize(("seed", "draft"), [(0, 10), (1, 25), (2, 49)])
def test_d2t_and_t2d_match_a_brute_force_count(tmp_path, seed, draft):
    rows = random_rows(seed)
    result = vocab_map(save_rows(tmp_path, rows), draft, tmp_path / "vm.pt", target_vocab_size=64)
    saved = torch.load(tmp_path / "vm.pt")
    d2t, t2d = brute_force(rows, draft, 64)
    assert saved["d2t"].dtype == torch.int64 and saved["t2d"].dtype == torch.bool
    assert saved["d2t"].tolist() == d2t and saved["t2d"].tolist() == t2d
    assert result.target_vocab_size == 64


def test_fewer_used_ids_than_the_draft_size_are_padded_with_the_smallest_unused(tmp_path):
    rows = [([5, 7, 7, 9], [1, 1, 1, 0])]
    vocab_map(save_rows(tmp_path, rows), 4, tmp_path / "vm.pt", target_vocab_size=12)
    saved = torch.load(tmp_path / "vm.pt")
    used = [i + d for i, d in enumerate(saved["d2t"].tolist())]
    assert used == [0, 1, 5, 7]  # 5 and 7 are used; 0 and 1 pad; 9 is unmasked
    assert saved["t2d"].nonzero().flatten().tolist() == used


def test_ties_are_broken_by_the_smaller_id():
    counts = torch.tensor([0, 3, 3, 3, 1]).numpy()
    d2t, _ = build_mapping(counts, 2)
    assert [i + d for i, d in enumerate(d2t.tolist())] == [1, 2]


def test_the_mapping_is_deterministic(tmp_path):
    root = save_rows(tmp_path, random_rows(3))
    vocab_map(root, 20, tmp_path / "a.pt", target_vocab_size=64)
    vocab_map(root, 20, tmp_path / "b.pt", target_vocab_size=64)
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert torch.equal(a["d2t"], b["d2t"]) and torch.equal(a["t2d"], b["t2d"])


def test_a_mapping_for_the_same_data_is_left_as_is(tmp_path):
    root = save_rows(tmp_path, random_rows(4), target_vocab_size=64)
    first = vocab_map(root, 20, tmp_path / "vm.pt")
    again = vocab_map(root, 20, tmp_path / "vm.pt")
    assert (first.status, again.status) == ("written", "unchanged")


def test_a_mapping_for_other_data_is_recomputed_and_overwritten(tmp_path):
    old_rows, new_rows = random_rows(5), random_rows(6)
    vocab_map(save_rows(tmp_path / "old", old_rows), 20, tmp_path / "vm.pt", 64)
    result = vocab_map(save_rows(tmp_path / "new", new_rows), 20, tmp_path / "vm.pt", 64)
    assert result.status == "overwritten" and "recomputed" in result.message
    d2t, _ = brute_force(new_rows, 20, 64)
    assert torch.load(tmp_path / "vm.pt")["d2t"].tolist() == d2t


def test_a_mapping_file_changed_behind_the_sidecar_is_rewritten(tmp_path):
    root = save_rows(tmp_path, random_rows(7), target_vocab_size=64)
    vocab_map(root, 20, tmp_path / "vm.pt")
    torch.save({"d2t": torch.zeros(20, dtype=torch.int64)}, tmp_path / "vm.pt")
    assert vocab_map(root, 20, tmp_path / "vm.pt").status == "overwritten"
    assert "t2d" in torch.load(tmp_path / "vm.pt")


def test_the_sidecar_records_the_data_fingerprint_and_sizes(tmp_path):
    root = save_rows(tmp_path, random_rows(8), target_vocab_size=64)
    result = vocab_map(root, 16, tmp_path / "vm.pt")
    meta = json.loads((tmp_path / "vm.pt.json").read_text())
    assert meta["fingerprint"] == result.fingerprint
    assert (meta["draft_vocab_size"], meta["target_vocab_size"]) == (16, 64)


def test_an_unknown_target_vocab_size_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="--target-vocab-size"):
        vocab_map(save_rows(tmp_path, random_rows(9)), 8, tmp_path / "vm.pt")


def test_ids_beyond_the_target_vocab_are_an_error(tmp_path):
    root = save_rows(tmp_path, [([3, 99], [1, 1])])
    with pytest.raises(ValueError, match="outside the target vocab"):
        vocab_map(root, 2, tmp_path / "vm.pt", target_vocab_size=50)
