"""The simulator's tokenizer and chat template as a Hugging Face fast tokenizer.

    python -m simulator.hf_tokenizer OUT_DIR

``eaglegen tokenize --tokenizer OUT_DIR`` then renders and tokenizes simulated records exactly
as the simulator did (:mod:`simulator.tokenizer`), so rows built from the records' token ids
and rows rendered from their text can be compared (they agree). Built from the ``tokenizers``
library's parts, no Python in the loop:

* a Unigram model over the simulator's vocabulary, ids unchanged, with byte fallback for the
  ids 0-255 (named ``<0xNN>``, as byte fallback wants them);
* a normalizer that turns any ``[16 hex digits]`` into ``<|key|>`` (the simulator does so for
  its own key inside assistant text; prompts never hold such a string) and the few words that
  are spelled like a letter chunk or a lone capital into private-use characters, so that a
  vocabulary string maps to one id;
* a pre-tokenizer that cuts text into exactly the simulator's tokens: whole words, letter
  chunks of up to three (the first with its leading space), single characters.

The chat template renders what :func:`simulator.tokenizer.encode_chat` encodes (tools in the
system turn, an assistant's ``tool_calls`` after its content, as
:mod:`simulator.tool_calls` writes them); a final assistant message renders as the model's
output after the generation prompt, ``<think>reasoning</think>content<|im_end|>``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from simulator.tokenizer import (
    FIRST_CHUNK,
    IM_END,
    IM_START,
    KEY,
    SPECIALS,
    THINK,
    THINK_END,
    VOCAB_SIZE,
    WORD_LIST,
    _chunk_text,
)

KEY_TOKEN = "<|key|>"
_PRIVATE = 0xE000  # first private-use character standing for a word

CHAT_TEMPLATE = (
    "{%- set ns = namespace(first=0) -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' -%}"
    "{{ messages[0].content + '\\n\\n' }}{%- set ns.first = 1 -%}"
    "{%- endif -%}"
    "{{ '<tools>' + (tools | tojson) + '</tools><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages[ns.first:] -%}"
    "{{ '<|im_start|>' + message.role + '\\n' }}"
    "{%- if loop.last and message.role == 'assistant' and not add_generation_prompt -%}"
    "{{ '<think>' + (message.reasoning_content or '') + '</think>' }}"
    "{%- endif -%}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set args = call.function.arguments -%}"
    "{{ '<tool_call>{\"name\": ' + (call.function.name | tojson) + ', \"arguments\": ' }}"
    "{{ (args if args is string else args | tojson) + '}</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '<think></think>' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def _clashes(word: str) -> bool:
    """Whether a word is spelled like a letter chunk or a lone capital (which are not words)."""
    return re.fullmatch(r" ?[a-z]{1,3}|[A-Z]", word) is not None


def _stand_ins() -> dict[str, str]:
    """The words written as private-use characters, and their characters."""
    clashing = [w for w in WORD_LIST if _clashes(w)]
    return {w: chr(_PRIVATE + i) for i, w in enumerate(clashing)}


def vocabulary() -> list[str]:
    """Every id's string, in id order (the stand-in character for clashing words)."""
    names = {IM_START: "<|im_start|>", IM_END: "<|im_end|>", THINK: "<think>",
             THINK_END: "</think>", KEY: KEY_TOKEN}  # fmt: skip
    assert set(names.values()) - {KEY_TOKEN} == set(SPECIALS)
    stand_in = _stand_ins()
    vocab = [f"<0x{i:02X}>" for i in range(256)] + [names[i] for i in range(256, 261)]
    vocab += [stand_in.get(w, w) for w in WORD_LIST]
    vocab += [_chunk_text(i) for i in range(FIRST_CHUNK, VOCAB_SIZE)]
    assert len(vocab) == VOCAB_SIZE
    return vocab


def _pieces_pattern(stand_in: dict[str, str]) -> str:
    """Whole words (only where a letter run is exactly one), stand-ins, chunks, characters."""
    words = sorted((w for w in WORD_LIST if w.strip() and w not in stand_in), key=len)
    spaced = "|".join(re.escape(w[1:]) for w in reversed(words) if w.startswith(" "))
    bare = "|".join(re.escape(w) for w in reversed(words) if not w.startswith(" "))
    return (
        f"(?: (?:{spaced})|(?<![A-Za-z ])(?:{bare}))(?![A-Za-z])"
        f"|[{''.join(stand_in.values())}]| ?[a-z]{{1,3}}|[\\s\\S]"
    )


def build() -> Any:
    """The simulator's tokenizer as a ``transformers`` PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre
    from transformers import PreTrainedTokenizerFast

    stand_in = _stand_ins()
    tok = Tokenizer(models.Unigram([(s, -1.0) for s in vocabulary()], 0, byte_fallback=True))
    words = [normalizers.Replace(Regex(_whole(word)), char) for word, char in stand_in.items()]
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(r"\[[0-9a-f]{16}\]"), KEY_TOKEN), *words]
    )
    tok.pre_tokenizer = pre.Split(Regex(_pieces_pattern(stand_in)), behavior="isolated")
    tok.decoder = decoders.Sequence(
        [*(decoders.Replace(c, w) for w, c in stand_in.items()), decoders.ByteFallback(),
         decoders.Fuse()]
    )  # fmt: skip
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_special_tokens([AddedToken(KEY_TOKEN, special=True, normalized=True)])
    fast: Any = PreTrainedTokenizerFast  # untyped in transformers 5
    return fast(
        tokenizer_object=tok, eos_token="<|im_end|>", chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False, name_or_path="eaglegen-sim",
    )  # fmt: skip


def _whole(word: str) -> str:
    """A regex for ``word`` where the simulator reads it as a whole word."""
    if word.startswith(" "):
        return f"{re.escape(word)}(?![A-Za-z])"
    return f"(?<![A-Za-z ]){re.escape(word)}(?![A-Za-z])"


def save(out: Path) -> None:
    """Write the tokenizer (tokenizer.json, its config and chat template) to ``out``."""
    build().save_pretrained(str(out))


if __name__ == "__main__":
    save(Path(sys.argv[1]))
    print(f"simulator tokenizer written to {sys.argv[1]}")
