"""Run SpecForge's and speculators' own data code on an `eaglegen export`; print their rows.

Runs in the trainers' venv (scripts/setup_trainers.sh), never in EagleGen's: it imports
nothing from EagleGen. Usage:

    peer_rows.py EXPORT_DIR TOKENIZER_DIR DRAFT_VOCAB_SIZE TARGET_VOCAB_SIZE OUT.json

For each route it writes the rows the trainer would train on, in the order they come out, as
``{"ids": [...], "mask": [...], "key": ...}`` (``key`` is the EagleGen row id where the route
keeps one, else null), and the vocabulary mappings each trainer loads or builds.

speculators renders conversations through a vLLM server's ``/v1/chat/completions/render``;
here a stand-in on 127.0.0.1 answers it with ``transformers``' ``apply_chat_template`` over the
same tokenizer and template (what vLLM's renderer calls for an HF chat template), passing the
messages as given, ``chat_template_kwargs`` and right truncation as vLLM does.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MAX_LENGTH = 8192
TEMPLATE = "eaglegen-qwen3"


def register_template() -> None:
    """Register the SpecForge template docs/trainers.md gives for Qwen3 (no default system)."""
    from specforge.data.template import TEMPLATE_REGISTRY, ChatTemplate

    TEMPLATE_REGISTRY.register(
        name=TEMPLATE,
        template=ChatTemplate(
            assistant_header="<|im_start|>assistant\n",
            user_header="<|im_start|>user\n",
            system_prompt=None,
            end_of_turn_token="<|im_end|>\n",
            parser_type="thinking",
            enable_thinking=False,
        ),
        override=True,
    )


def specforge_routes(export: Path, tok: Any) -> dict[str, list[dict[str, Any]]]:
    """Rows from SpecForge's prepare_prompt_tasks: pre-tokenized JSONL, then conversations."""
    from datasets import load_dataset
    from specforge.data.prompt_builder import prepare_prompt_tasks

    register_template()
    common = dict(max_length=MAX_LENGTH, is_preformatted=False, cache_dir=None, cache_key=None)
    common |= dict(num_proc=1, min_loss_tokens=0, train_only_last_turn=True)
    train = export / "specforge" / "train.jsonl"
    keys = [json.loads(line)["id"] for line in train.read_text().splitlines()]
    tasks = prepare_prompt_tasks(train, tok, chat_template=TEMPLATE, **common)
    rows = [_row(t["payload"], key) for t, key in zip(tasks, keys, strict=True)]
    conv = str(export / "specforge" / "conversations.jsonl")
    tasks = prepare_prompt_tasks(conv, tok, chat_template=TEMPLATE, **common)
    # build_eagle3_dataset shuffles with seed 42 and drops the id: the same shuffle finds them.
    order = load_dataset("json", data_files=conv, split="train").shuffle(seed=42)["id"]
    conv_rows = [_row(t["payload"], key) for t, key in zip(tasks, order, strict=True)]
    return {"specforge_jsonl": rows, "specforge_conversations": conv_rows}


def _row(payload: dict[str, Any], key: str | None) -> dict[str, Any]:
    """Return one row as plain lists."""
    ids, mask = payload["input_ids"], payload["loss_mask"]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    mask = mask.tolist() if hasattr(mask, "tolist") else list(mask)
    if ids and isinstance(ids[0], list):
        ids, mask = ids[0], mask[0]
    return {"ids": [int(i) for i in ids], "mask": [int(m) for m in mask], "key": key}


def speculators_loader(export: Path, hidden: Path) -> list[dict[str, Any]]:
    """Rows as speculators' trainer batches them: ArrowDataset, cached states, CollateFn."""
    import torch
    from hs_connectors import FileTransfer
    from safetensors.torch import save_file
    from speculators.train.data import ArrowDataset, CollateFn, build_client_item

    data = export / "speculators" / "data"
    ds = ArrowDataset(MAX_LENGTH, data, transfer=FileTransfer(hidden), on_missing="raise")
    if ds.approx_lengths != [len(ds.data[i]["input_ids"]) for i in range(len(ds))]:
        raise AssertionError("seq_len column differs from the rows' lengths")
    hidden.mkdir(parents=True, exist_ok=True)
    collate = CollateFn(MAX_LENGTH, hidden_size=2, num_target_layers=3, dtype=torch.float32)
    rows = []
    for i in range(len(ds)):
        # What vLLM would return for the ids the trainer sends it (build_client_item).
        sent = torch.tensor(build_client_item(ds.data[i])["input_ids"], dtype=torch.long)
        states = torch.zeros(len(sent), 4, 2)
        save_file({"token_ids": sent, "hidden_states": states}, str(hidden / f"hs_{i}.safetensors"))
        batch = collate([ds[i]])
        # The collator pads to max_len; document_ids marks the row's own positions.
        n = int((batch["document_ids"][0] >= 0).sum())
        sample = {"input_ids": batch["input_ids"][0, :n], "loss_mask": batch["loss_mask"][0, :n]}
        rows.append(_row(sample, None))
    return rows


class _Render(BaseHTTPRequestHandler):
    """The stand-in for vLLM's render endpoint (see module doc)."""

    tokenizer: Any = None

    def do_POST(self) -> None:
        """Render the messages to token ids as vLLM's /v1/chat/completions/render does."""
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = self.tokenizer.apply_chat_template(
            body["messages"],
            tools=body.get("tools"),
            add_generation_prompt=body["add_generation_prompt"],
            tokenize=True,
            return_dict=False,
            **(body.get("chat_template_kwargs") or {}),
        )
        limit = body.get("truncate_prompt_tokens")
        ids = list(ids)[:limit] if limit else list(ids)
        out = json.dumps({"token_ids": ids}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        """Stay quiet."""


def speculators_conversations(export: Path, tok: Any) -> list[dict[str, Any]]:
    """Rows from speculators' build_speculator_training_dataset over the conversations file."""
    from datasets import load_dataset
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    _Render.tokenizer = tok
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Render)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        convs = str(export / "speculators" / "conversations.jsonl")
        raw = load_dataset("json", data_files=convs, split="train")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        ds = build_speculator_training_dataset(
            raw, tok, max_length=MAX_LENGTH, num_proc=1, render_endpoint=url
        )
    finally:
        server.shutdown()
    return [_row(ds[i], None) for i in range(len(ds))]


def vocab(export: Path, draft: int, target: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each trainer's loaders on EagleGen's files, and each one's own mapping from the rows."""
    import numpy as np
    import torch
    from datasets import Dataset, load_from_disk
    from specforge.data.preprocessing import generate_vocab_mapping_file
    from specforge.modeling.draft.base import Eagle3DraftModel
    from speculators.train.cli import _load_mappings
    from speculators.train.vocab_mapping import (
        build_vocab_mappings_from_distribution,
        save_token_frequency_distribution,
    )

    stub = torch.nn.Module()
    stub.register_buffer("d2t", torch.zeros(draft, dtype=torch.long))
    stub.register_buffer("t2d", torch.zeros(target, dtype=torch.bool))
    Eagle3DraftModel.load_vocab_mapping(stub, str(export / "specforge" / "vocab_mapping.pt"))
    data = export / "speculators" / "data"
    d2t, t2d, size = _load_mappings(data / f"d2t-{draft}.npy", data / f"t2d-{draft}.npy", draft)
    with tempfile.TemporaryDirectory() as tmp:
        ds = Dataset.from_dict(
            {"input_ids": [r["ids"] for r in rows]} | {"loss_mask": [r["mask"] for r in rows]}
        )
        ds.set_format("torch")
        own = torch.load(generate_vocab_mapping_file(ds, target, draft, tmp, "sf"))
        save_token_frequency_distribution(load_from_disk(str(data)), Path(tmp) / "freq.pt")
        freq = torch.load(Path(tmp) / "freq.pt", weights_only=True)
    sp_d2t, _ = build_vocab_mappings_from_distribution(freq, draft, target)
    return {
        "specforge_loaded": _used(stub.d2t), "speculators_loaded": _used(d2t),
        "speculators_loaded_t2d": np.flatnonzero(t2d.numpy()).tolist(), "speculators_size": size,
        "specforge_own": _used(own["d2t"]), "speculators_own": _used(sp_d2t),
        "counts": {str(k): v for k, v in Counter(freq).items()},
    }  # fmt: skip


def _used(d2t: Any) -> list[int]:
    """Return the target ids a d2t offset table selects."""
    return [int(v) + i for i, v in enumerate(d2t.tolist())]


def main() -> None:
    """Run every route and write the JSON result."""
    from transformers import AutoTokenizer

    export, tok_dir, draft, target, out = sys.argv[1:6]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    result: dict[str, Any] = specforge_routes(Path(export), tok)
    with tempfile.TemporaryDirectory() as hidden:
        result["speculators_dataset"] = speculators_loader(Path(export), Path(hidden))
    result["speculators_conversations"] = speculators_conversations(Path(export), tok)
    sf_rows = result["specforge_jsonl"]
    result["vocab"] = vocab(Path(export), int(draft), int(target), sf_rows)
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
