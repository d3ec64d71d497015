"""``capture verify``'s cost: cheap checks in seconds per GB of files, the recompute in rows/s.

    .venv/bin/python bench/bench_verify.py [--rows 64] [--tokens 2048] [--hidden 1024]
        [--layers 8] [--dtype bfloat16] [--layout specforge] [--recompute 8] [--device cpu]
        [--shape llama8b] [--results FILE]

Two outputs of one random model (Qwen3 of ``--layers`` x ``--hidden``, or ``--shape llama8b``:
Llama-3.1-8B's shape), its final norm's weight drawn at random so the norm checks divide by
something other than ones:

- ``bulk``: ``--rows`` rows of ``--tokens`` tokens, states drawn at random (the final state
  through the model's own final norm, so every check passes), written by capture's ``encode``:
  ``verify_run`` with no sample is timed on it twice (the second from the page cache), and
  SHA-256 alone over the same files for comparison;
- ``real``: ``--recompute`` rows of 1/2 to 1 x ``--tokens`` tokens captured by capture's own
  batched forward pass (``TargetModel``, all in one padded batch, on ``--device``), then
  verified with every row recomputed alone (``Recompute``): rows/s of the recompute, and the
  largest relative error seen per slot against the tolerance.

Runs in process without Redis or ``datasets`` (rows are built here), so it also runs where only
torch, transformers, safetensors and pydantic are installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from capture.layouts import encode, relative_path  # noqa: E402
from capture.rows import Row  # noqa: E402
from capture.spec import CaptureSpec, Layout, ManifestLine  # noqa: E402

RUN = "bench-verify"


def build_model(out: Path, args: argparse.Namespace) -> Path:
    """A random model saved with safetensors; its final norm's weight in [0.5, 2)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    torch.manual_seed(0)
    config: Any
    if args.shape == "llama8b":
        config = LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        )  # fmt: skip
    else:
        config = Qwen3Config(
            vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
            num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
            head_dim=args.hidden // 8, max_position_embeddings=8192, tie_word_embeddings=False,
        )  # fmt: skip
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        model.get_decoder().norm.weight.uniform_(0.5, 2.0)
    model.save_pretrained(out, safe_serialization=True)
    del model
    return out


def write_run(out: Path, layout: Layout, rows: list[Row], states: list[Any]) -> int:
    """Each row's file and the manifest; the bytes written."""
    lines, total = [], 0
    for row, state in zip(rows, states, strict=True):
        blob = encode(layout, row, state, RUN)
        path = out / relative_path(layout, row.index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        total += len(blob)
        line = ManifestLine(
            id=str(row.index), run=RUN, row=row.index, sample=row.sample,
            file=relative_path(layout, row.index), tokens=len(row.input_ids), bytes=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
        )  # fmt: skip
        lines.append(line.to_json() + "\n")
    (out / "manifest.jsonl").write_text("".join(lines))
    return total


def random_states(target: Any, tokens: int) -> Any:
    from capture.forward import States

    aux = torch.randn(tokens, 3, target.hidden).to(target.dtype)
    pre = (torch.randn(tokens, target.hidden) * 10).to(target.dtype)
    return States(aux, pre, target.final_norm(pre))


def make_rows(count: int, low: int, high: int, vocab: int, seed: int) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        n = rng.randint(low, high)
        rows.append(Row(i, f"s{i}", [rng.randrange(1, vocab) for _ in range(n)], [1] * n))
    return rows


def timed_verify(
    out: Path, rows: list[Row], args: argparse.Namespace, model_dir: Path, recompute: Any = None
) -> tuple[Any, float]:
    """``verify_run`` over ``out``: every row recomputed when ``recompute`` is given."""
    from capture.verify import Expect, Verifier, verify_run

    target = _target(model_dir)
    aux = _aux(args.layout, target.layers)
    expect = Expect(args.layout, RUN, target.hidden, target.dtype, aux, target.norm_weight)
    share = 1.0 if recompute is not None else 0.0
    spec = CaptureSpec(
        tokenized_dir="-", fingerprint="-", out_dir=str(out), layout=args.layout, rows=len(rows)
    )
    verifier = Verifier(expect, rows, out, recompute)
    began = time.perf_counter()
    report = verify_run(spec, verifier, share, args.jobs)
    return report, time.perf_counter() - began


def _target(model_dir: Path) -> Any:
    from capture.vllm_backend import TargetConfig

    return TargetConfig.read(str(model_dir))


def _aux(layout: Layout, layers: int) -> tuple[int, int, int]:
    from capture.layers import plan

    return plan(layout, layers, None).aux


def sha_only(out: Path) -> float:
    began = time.perf_counter()
    for path in out.rglob("*"):
        if path.is_file() and path.name != "manifest.jsonl":
            hashlib.sha256(path.read_bytes()).hexdigest()
    return time.perf_counter() - began


def bulk(tmp: Path, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    target = _target(model_dir)
    rows = make_rows(args.rows, args.tokens, args.tokens, 4000, seed=1)
    out = tmp / "bulk"
    size = write_run(out, args.layout, rows, [random_states(target, args.tokens) for _ in rows])
    first = timed_verify(out, rows, args, model_dir)
    second = timed_verify(out, rows, args, model_dir)
    assert not first[0].bad and not second[0].bad, first[0].to_json()
    sha = sha_only(out)
    gb = size / 1e9
    return {
        "bytes": size, "rows": len(rows), "seconds_first": round(first[1], 3),
        "seconds_cached": round(second[1], 3), "s_per_gb_cached": round(second[1] / gb, 3),
        "gb_per_s_cached": round(gb / second[1], 3), "sha256_only_s_per_gb": round(sha / gb, 3),
    }  # fmt: skip


def real(tmp: Path, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from capture.forward import TargetModel
    from capture.recompute import Recompute, difference
    from capture.verify import decode

    capture = TargetModel(str(model_dir), args.device)
    rows = make_rows(args.recompute, args.tokens // 2, args.tokens, 4000, seed=2)
    aux = _aux(args.layout, capture.layers)
    states = capture.forward([r.input_ids for r in rows], aux)  # one padded batch, as a worker
    for state in states:
        state.wait()  # a GPU batch's copy to the host may still be in flight
    del capture
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    out = tmp / "real"
    write_run(out, args.layout, rows, states)
    recompute = Recompute(str(model_dir), args.device)
    recompute.states(rows[0].input_ids, aux)  # warm-up: kernels chosen, memory taken
    cheap, cheap_s = timed_verify(out, rows, args, model_dir)
    full, full_s = timed_verify(out, rows, args, model_dir, recompute)
    worst, whole, shifted = [0.0] * 4, [0.0] * 4, []
    later = (aux[0] + 1, aux[1] + 1, aux[2] + 1)  # a layer off by one (TorchSpec #87)
    for row in rows:
        got = decode(args.layout, (out / relative_path(args.layout, row.index)).read_bytes())
        want = recompute.states(row.input_ids, aux)
        final = want.post_norm if args.layout == "specforge" else want.pre_norm
        pairs = [(got.aux[:, k], want.aux[:, k]) for k in range(3)] + [(got.final, final)]
        gaps = [difference(a, b) for a, b in pairs]
        worst = [max(w, gap.token) for w, gap in zip(worst, gaps, strict=True)]
        whole = [max(w, gap.row) for w, gap in zip(whole, gaps, strict=True)]
        moved = recompute.states(row.input_ids, later)
        shifted += [difference(got.aux[:, k], moved.aux[:, k]).row for k in range(3)]
    tokens = sum(len(r.input_ids) for r in rows)
    return {
        "rows": len(rows), "tokens": tokens, "bad_rows": len(full.bad),
        "bad": full.to_json()["bad"],
        "recomputed": full.recomputed, "recompute_s": round(full_s - cheap_s, 3),
        "recompute_rows_per_s": round(len(rows) / (full_s - cheap_s), 3),
        "recompute_tokens_per_s": round(tokens / (full_s - cheap_s), 1),
        "worst_relative_error": [float(f"{w:.3g}") for w in worst], "cheap_bad": len(cheap.bad),
        "worst_row_error": [float(f"{w:.3g}") for w in whole],
        "off_by_one_row_error_min": float(f"{min(shifted):.3g}"),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layout", default="specforge", choices=["specforge", "speculators"])
    parser.add_argument("--recompute", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="", choices=["", "llama8b"])
    parser.add_argument("--jobs", type=int, default=1, help="Rows checked at a time.")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--tmp", type=Path, default=None, help="Scratch folder (default: /tmp).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
        tmp = Path(scratch)
        began = time.perf_counter()
        model_dir = build_model(tmp / "model", args)
        result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
        result["model_build_s"] = round(time.perf_counter() - began, 1)
        result["bulk"] = bulk(tmp, model_dir, args) if args.rows else None
        result["real"] = real(tmp, model_dir, args) if args.recompute else None
    text = json.dumps(result, indent=2)
    print(text)
    if args.results is not None:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
