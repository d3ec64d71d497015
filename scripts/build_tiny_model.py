"""Build a tiny Qwen3ForCausalLM for end-to-end tests against a real vLLM server.

No hub access: the byte-level BPE tokenizer is trained here on the repo's bundled prompts, the
weights are random. Run it with the vLLM venv's python (torch, transformers, tokenizers):

    .vllm-venv/bin/python scripts/build_tiny_model.py --out .eaglegen/tiny-qwen3

Random weights alone never say ``</think>`` or ``<|im_end|>``, so every turn would be cut at
``max_tokens`` and no conversation would reach its second turn. A short answer path is planted
on top of the random weights: the last token of each generation prompt leads, one token at a
time, through a reasoning phrase, ``</think>``, an answer phrase and ``<|im_end|>``. Path tokens
get orthogonal, large embeddings and the unembedding row of each successor points at its
predecessor, so the random layers (small next to those embeddings) cannot change the argmax.
The expected texts are written to ``eaglegen_path.json`` beside the weights for the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 2048
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]
REASONING = " The user asks a question, so I should answer it briefly"
ANSWER = " Here is my short reply."
EMBED_SCALE = 30.0  # path embeddings dwarf what two random layers add to the residual
LOGIT_SCALE = 2.0  # x sqrt(hidden) after the final norm: a margin of ~20 logits
INFO_FILE = "eaglegen_path.json"

# Qwen3's template, reduced to chat: earlier turns' reasoning is dropped (only assistant
# messages after the last user message keep theirs), and the generation prompt opens the
# think block, or closes an empty one when enable_thinking is false.
CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content or '' %}"
    "{%- set reasoning = '' %}"
    "{%- if message.reasoning_content is string %}"
    "{%- set reasoning = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query and reasoning %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content.lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def corpus(data_dir: Path) -> list[str]:
    """Every string in the bundled prompt files, plus the template's own markup."""
    texts = [CHAT_TEMPLATE, REASONING, ANSWER, "\n\n" * 50]
    for path in sorted(data_dir.glob("*.json*")):
        raw = path.read_text(encoding="utf-8")
        rows = [json.loads(raw)] if path.suffix == ".json" else map(json.loads, raw.splitlines())
        for row in rows:
            texts.extend(_strings(row))
    return texts


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE with ChatML specials and Qwen3's think markers as added tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # Not special, as in Qwen3: decoding keeps them, so the reasoning parser sees them.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(token_id, int), token
    return token_id


def answer_path(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Tokens from the thinking prompt's last token to ``<|im_end|>``, each leading to the next.

    The non-thinking prompt ends with ``</think>`` and the same blank line that follows
    ``</think>`` on the path, so it joins the path there.
    """
    thinking_end = _ids(tokenizer, "<|im_start|>assistant\n<think>\n")[-1]
    blank = _ids(tokenizer, "</think>\n\n")[1:]
    assert len(blank) == 1, "the tokenizer must merge a blank line into one token"
    path = [thinking_end, *_ids(tokenizer, REASONING), _token_id(tokenizer, "</think>")]
    path += [blank[0], *_ids(tokenizer, ANSWER), _token_id(tokenizer, "<|im_end|>")]
    assert len(set(path)) == len(path), f"path tokens must be distinct: {path}"
    return path


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen3ForCausalLM:
    """Hidden 128, 2 layers, 4 heads of 32: random weights with the answer path planted."""
    torch.manual_seed(seed)
    vocab = (len(tokenizer) + 63) // 64 * 64
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=_token_id(tokenizer, "<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    model = Qwen3ForCausalLM(config)
    plant_path(model, answer_path(tokenizer))
    return model


@torch.no_grad()
def plant_path(model: Qwen3ForCausalLM, path: list[int]) -> None:
    """Make ``path[i]`` the argmax after ``path[i - 1]`` whatever comes before it."""
    hidden = model.config.hidden_size
    basis, _ = torch.linalg.qr(torch.randn(hidden, len(path) - 1))
    embed = model.model.embed_tokens.weight
    unembed = model.lm_head.weight
    for i, (token, successor) in enumerate(itertools.pairwise(path)):
        embed[token] = EMBED_SCALE * basis[:, i]
        unembed[successor] += LOGIT_SCALE * basis[:, i]


def check_path(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """Greedy-decode both generation prompts; fail unless each follows the planted path."""
    expected = {"thinking": REASONING + "</think>\n\n" + ANSWER, "plain": ANSWER}
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    for name, thinking in (("thinking", True), ("plain", False)):
        prompt = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=thinking
        )
        ids = torch.tensor([_ids(tokenizer, str(prompt))])
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert text == expected[name], f"{name}: planted path not followed: {text!r}"
    return {"reasoning": REASONING, "answer": ANSWER}


def fingerprint() -> str:
    """Identifies this script's version: the model is rebuilt when the script changes."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def build(out: Path, data_dir: Path, seed: int) -> None:
    """Build into a temporary folder, then swap it in, so a half-built model is never used."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = train_tokenizer(corpus(data_dir))
    model = build_model(tokenizer, seed)
    info = check_path(model, tokenizer)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    info |= {"fingerprint": fingerprint(), "path_tokens": answer_path(tokenizer)}
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def is_current(out: Path) -> bool:
    """True when ``out`` holds a complete model built by this version of the script."""
    try:
        info = json.loads((out / INFO_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(info.get("fingerprint") == fingerprint())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".eaglegen" / "tiny-qwen3")
    parser.add_argument("--data", type=Path, default=ROOT / "data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args()
    if not args.force and is_current(args.out):
        print(f"tiny model: up to date in {args.out}")
        return
    build(args.out, args.data, args.seed)
    print(f"tiny model: built in {args.out}")


if __name__ == "__main__":
    main()
