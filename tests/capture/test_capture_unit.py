"""Capture's pure parts: layers, batching, atomic files, layouts, dtypes, NaN rows."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from capture.batcher import Batcher, _Waiting, take_batch
from capture.files import stale_temporaries, write_atomic
from capture.forward import TargetModel
from capture.layers import parse_aux, plan
from capture.layouts import encode, relative_path, written_by
from capture.rows import Row
from common.errors import NotOurs
from tests.capture.helpers import build_model


def test_both_defaults_pick_the_same_tensors_and_bad_layers_are_refused():
    assert plan("specforge", 32, None).aux == (2, 16, 29)  # [1, 15, 28] as outputs
    assert plan("speculators", 32, None).aux == (2, 16, 29)  # [2, 16, 29] as inputs
    assert plan("speculators", 6, (1, 2, 6)).aux == (1, 2, 6)  # 6 = L: before the final norm
    with pytest.raises(ValueError, match="defaults do not fit"):
        plan("specforge", 2, None)
    with pytest.raises(ValueError, match="three aux layers"):
        plan("specforge", 8, (1, 2))
    assert parse_aux("1, 3,5") == (1, 3, 5) and parse_aux(None) is None
    with pytest.raises(ValueError):
        parse_aux("a,b,c")


def test_a_batch_stops_at_the_token_budget_counting_padding():
    rows = [_Waiting([1] * n, (1, 2, 3)) for n in (10, 30, 5, 5)]
    # Nearest in length first: 5, 5 (3 x 10 = 30), then 30 would pad 4 x 30 = 120 > 64.
    assert [len(w.ids) for w in take_batch(rows, 64, max_padding=10)] == [5, 5, 10]
    assert [len(w.ids) for w in take_batch(rows, 8)] == [10]  # too long alone: runs alone
    other = [
        _Waiting([1] * 3, (1, 2, 3)),
        _Waiting([1] * 3, (2, 3, 4)),
        _Waiting([1] * 3, (1, 2, 3)),
    ]
    assert len(take_batch(other, 100)) == 2  # another run's layers wait for their own batch


def test_batches_of_mixed_lengths_pad_at_most_five_percent():
    import random

    rng = random.Random(0)
    # A chat dataset's lengths: log-normal, mean ~1,460 tokens, 16 to 8,192.
    lengths = [min(max(int(rng.lognormvariate(7.0, 0.7)), 16), 8192) for _ in range(2000)]
    waiting = [_Waiting([1] * n, (1, 2, 3)) for n in lengths[:16]]
    lengths, real, padded = lengths[16:], 0, 0
    while len(lengths) > 16:
        batch = take_batch(waiting, 16384)
        real += sum(len(w.ids) for w in batch)
        padded += max(len(w.ids) for w in batch) * len(batch)
        # The batch's rows are done; as many new ones arrive (16 task threads).
        waiting = [w for w in waiting if all(w is not b for b in batch)]
        waiting += [_Waiting([1] * n, (1, 2, 3)) for n in lengths[: len(batch)]]
        lengths = lengths[len(batch) :]
    assert 0 < padded <= real * 1.05


def test_rows_from_many_threads_share_forward_passes():
    calls: list[int] = []

    class Done(int):
        def wait(self) -> None:
            pass

    def forward(batch, aux):
        calls.append(len(batch))
        return [Done(len(ids)) for ids in batch]

    batcher = Batcher(forward, budget=1000, linger_s=0.05)  # type: ignore[arg-type]
    got: list[object] = []
    threads = [
        threading.Thread(target=lambda n=n: got.append(batcher.run([1] * n, (1, 2, 3))))
        for n in range(100, 108)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert sorted(got) == list(range(100, 108)) and len(calls) < 8  # type: ignore[type-var]


def test_a_file_is_replaced_only_when_ours_and_no_temporary_is_left(tmp_path: Path):
    path = tmp_path / "g" / "f.bin"
    written = write_atomic(path, b"abc", lambda p: False)
    assert path.read_bytes() == b"abc" and written.bytes == 3
    with pytest.raises(NotOurs):
        write_atomic(path, b"xyz", lambda p: False)
    assert path.read_bytes() == b"abc"
    write_atomic(path, b"xyz", lambda p: True)
    assert path.read_bytes() == b"xyz" and stale_temporaries(tmp_path) == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_files_keep_the_models_dtype_and_name_their_run(tmp_path: Path, dtype: str):
    model = TargetModel(str(build_model(tmp_path / "m", dtype)))
    assert model.dtype == getattr(torch, dtype)
    ids = [5, 6, 7, 8]
    states = model.forward([ids], (1, 3, 6))[0]
    row = Row(0, "s0", ids, [0, 0, 1, 1])
    for layout in ("specforge", "speculators"):
        path = tmp_path / relative_path(layout, 0)  # type: ignore[arg-type]
        write_atomic(path, encode(layout, row, states, "run-a"), lambda p: False)  # type: ignore[arg-type]
        assert written_by(path, layout) == "run-a"  # type: ignore[arg-type]
    sf = torch.load(tmp_path / relative_path("specforge", 0), weights_only=True)
    sp = load_file(tmp_path / relative_path("speculators", 0))
    assert sf["hidden_state"].dtype == sf["aux_hidden_state"].dtype == getattr(torch, dtype)
    assert sp["hidden_states"].dtype == getattr(torch, dtype)
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(b"not a safetensors file")
    assert written_by(foreign, "speculators") is None


def test_nan_states_are_seen(tmp_path: Path):
    model = TargetModel(str(build_model(tmp_path / "m", nan_token=7)))
    clean, poisoned = model.forward([[5, 6, 8], [5, 7, 8]], (1, 3, 6))
    assert clean.finite() and not poisoned.finite()
