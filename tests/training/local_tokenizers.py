"""Build small chat tokenizers offline: a byte-level BPE plus one model family's special tokens.

No hub access: the BPE is trained in a fraction of a second on a built-in text, and the family's
control tokens are added as special tokens, so the official chat template in
tests/fixtures/chat_templates renders and tokenizes as it does for the real model (token ids
differ, structure does not).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"

# The Qwen2 / Llama-3 pre-tokenizer split: newline runs stay whole, as in the real families.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_WORDS_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their has been if more when "
    "will would who so no model answer question think reason step first then because "
    "therefore result python code function value number list data train draft token "
    "vocabulary server request hello world please explain why how what where compute sum two "
    "three four five ten hundred weather today tomorrow story poem write short long summary"
)
WORDS = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True)
class Family:
    """A model family: its chat template file and the control tokens its tokenizer carries."""

    name: str
    template: str
    special: tuple[str, ...]
    added: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


THINK = ("<think>", "</think>")
DS_SPECIAL = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")
KIMI_SPECIAL = (
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
)
LLAMA_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "qwen3",
            "qwen3.jinja",
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            THINK,
            eos="<|im_end|>",
        ),
        Family(
            "qwen3_legacy",
            "qwen3_legacy_2025-04.jinja",
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            THINK,
            eos="<|im_end|>",
        ),
        Family("llama3_1", "llama3_1.jinja", LLAMA_SPECIAL, bos=LLAMA_SPECIAL[0], eos="<|eot_id|>"),
        Family("llama3_2", "llama3_2.jinja", LLAMA_SPECIAL, bos=LLAMA_SPECIAL[0], eos="<|eot_id|>"),
        Family("deepseek_r1", "deepseek_r1.jinja", DS_SPECIAL, THINK, DS_SPECIAL[0], DS_SPECIAL[1]),
        Family(
            "deepseek_r1_distill",
            "deepseek_r1_distill.jinja",
            DS_SPECIAL,
            THINK,
            DS_SPECIAL[0],
            DS_SPECIAL[1],
        ),
        Family(
            "deepseek_v3_1", "deepseek_v3_1.jinja", DS_SPECIAL, THINK, DS_SPECIAL[0], DS_SPECIAL[1]
        ),
        Family(
            "deepseek_v3_1_thinking",
            "deepseek_v3_1.jinja",
            DS_SPECIAL,
            THINK,
            DS_SPECIAL[0],
            DS_SPECIAL[1],
            {"thinking": True},
        ),
        Family("kimi_k2_instruct", "kimi_k2_instruct.jinja", KIMI_SPECIAL, (), "[BOS]", "[EOS]"),
        Family("kimi_k2_thinking", "kimi_k2_thinking.jinja", KIMI_SPECIAL, THINK, "[BOS]", "[EOS]"),
        Family(
            "glm4_5",
            "glm4_5.jinja",
            ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
            THINK,
            eos="<|user|>",
        ),
        Family(
            "gpt_oss",
            "gpt_oss.jinja",
            (
                "<|startoftext|>",
                "<|endoftext|>",
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|return|>",
                "<|call|>",
                "<|constrain|>",
            ),
            eos="<|return|>",
        ),
    )
}


def sample_text(rng: random.Random, words: int) -> str:
    """Return a pseudo-sentence of about `words` words drawn from a fixed list."""
    out = []
    for i in range(words):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i == 0 or out[-1].endswith(".") else w)
        if rng.random() < 0.08:
            out[-1] += rng.choice([".", ",", "?", ":"])
        if rng.random() < 0.03:
            out.append(str(rng.randint(0, 2000)))
    return " ".join(out) + "."


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Return a small deterministic training corpus (prose, numbers, newlines, code-ish text)."""
    rng = random.Random(seed)
    text = [sample_text(rng, rng.randint(5, 40)) for _ in range(lines)]
    text += ["\n\n".join(text[i : i + 3]) for i in range(0, len(text), 3)]
    text += ["def f(x):\n    return x + 1\n", "Cutting Knowledge Date: December 2023\n"]
    return text


def build_tokenizer(
    family: str, vocab_size: int = 600, lines: int = 400, texts: list[str] | None = None
) -> Any:
    """Return a PreTrainedTokenizerFast for `family`, with its chat template and special tokens.

    The BPE is trained on ``texts`` if given, else on the built-in corpus of ``lines`` lines.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(fam.special),
        show_progress=False,
    )
    tok.train_from_iterator(texts if texts is not None else corpus(lines), trainer=trainer)
    if fam.added:
        tok.add_tokens(list(fam.added))
    template = (TEMPLATES_DIR / fam.template).read_text(encoding="utf-8")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        chat_template=template,
        clean_up_tokenization_spaces=False,
        name_or_path=f"local-{family}",
    )


@cache
def cached_tokenizer(family: str) -> Any:
    """Return the family's test tokenizer, built once per test session."""
    return build_tokenizer(family)
