"""The simulator's own tokenizer and chat template (pure, deterministic, stable across releases).

Vocabulary, by id:
  0-255    one byte each: the fallback that makes any text encodable;
  256-260  specials: <|im_start|>, <|im_end|> (end of turn), <think>, </think>, and <|key|>;
  261-     words: "\\n", the role names (system, user, assistant, tool, developer), then each
           answer word as "w", " w", "W" and " W";
  then     chunks of one to three lowercase letters, without then with a leading space.
Text is cut into special strings, words (a run of ASCII letters with at most one leading
space) and single characters. A word in the vocabulary is one id; other words go by letter
chunks (an uppercase letter is its byte); any other character is its UTF-8 bytes. Decoding
concatenates the pieces, so decode(encode(t)) == t.

<|key|> stands for "[<prompt key>]", the first content token of every simulated answer, whose
16 hex digits no vocabulary could hold. It is only used inside an assistant message (or
the generation after the prompt), where the key is that of the messages before it; so encoding
and decoding it need the conversation, which the template's structure gives.

Template (ChatML-like): each message is <|im_start|>role\\n content <|im_end|>\\n; the generation
prompt is <|im_start|>assistant\\n, followed by <think></think> when thinking is off (as Qwen3).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.answers import THINK_CLOSE, THINK_OPEN, WORDS, prompt_key
from simulator.tool_calls import rendered_calls, tools_block

Message = Mapping[str, Any]

IM_START = 256
IM_END = 257  # end of turn: the token a finished answer stops on
THINK = 258
THINK_END = 259
KEY = 260
SPECIALS: dict[str, int] = {
    "<|im_start|>": IM_START,
    "<|im_end|>": IM_END,
    THINK_OPEN: THINK,
    THINK_CLOSE: THINK_END,
}
ROLES = ("system", "user", "assistant", "tool", "developer")


def _words() -> tuple[str, ...]:
    forms = [f for w in WORDS for f in (w, " " + w, w.capitalize(), " " + w.capitalize())]
    return ("\n", *ROLES, *forms)


WORD_LIST = _words()
FIRST_WORD = 261
WORD_IDS: dict[str, int] = {w: FIRST_WORD + i for i, w in enumerate(WORD_LIST)}
NEWLINE = WORD_IDS["\n"]
_TEXT: dict[int, str] = {i: s for s, i in SPECIALS.items()} | {i: w for w, i in WORD_IDS.items()}

# Other lowercase letters go by chunks of up to three, with or without a leading space, so
# that English costs about three characters a token, as with a real tokenizer.
CHUNK_LEN = 3
_CHUNK_OFFSETS: list[int] = [sum(pow(26, n) for n in range(1, k)) for k in range(1, CHUNK_LEN + 2)]
_CHUNKS = _CHUNK_OFFSETS[-1]  # chunks of one to three letters
FIRST_CHUNK = FIRST_WORD + len(WORD_LIST)
VOCAB_SIZE = FIRST_CHUNK + 2 * _CHUNKS
_CHUNK_RE = re.compile(f"[a-z]{{1,{CHUNK_LEN}}}|[^a-z]")

_SPECIAL_RE = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")
# Words are a letter run with at most one leading space; anything else is one character.
_PIECE_RE = re.compile(r" ?[A-Za-z]+|.", re.DOTALL)


def key_text(key: str) -> str:
    """Return the text <|key|> stands for in a conversation whose prompt key is `key`."""
    return f"[{key}]"


def encode_text(text: str, key: str | None = None) -> list[int]:
    """Encode text; with `key`, its "[key]" becomes <|key|> (assistant text only)."""
    ids: list[int] = []
    for part in _SPECIAL_RE.split(text):
        if part in SPECIALS:
            ids.append(SPECIALS[part])
        elif key is not None and key_text(key) in part:
            pieces = part.split(key_text(key))
            for i, piece in enumerate(pieces):
                ids += ([KEY] if i else []) + _encode_plain(piece)
        else:
            ids += _encode_plain(part)
    return ids


def _encode_plain(text: str) -> list[int]:
    ids: list[int] = []
    for piece in _PIECE_RE.findall(text):
        word = WORD_IDS.get(piece)
        if word is not None:
            ids.append(word)
        elif piece[-1].isascii() and piece[-1].isalpha():
            ids += _encode_letters(piece)
        else:
            ids += list(piece.encode("utf-8"))
    return ids


def _encode_letters(piece: str) -> list[int]:
    ids: list[int] = []
    space = piece.startswith(" ")
    for run in _CHUNK_RE.findall(piece.removeprefix(" ")):
        if run.islower():
            ids.append(_chunk_id(run, space))
        else:  # an uppercase letter: its byte, after the space it may follow
            ids += [32, ord(run)] if space else [ord(run)]
        space = False
    return ids


def _chunk_id(letters: str, space: bool) -> int:
    index = 0
    for char in letters:
        index = index * 26 + ord(char) - ord("a")
    return FIRST_CHUNK + (_CHUNKS if space else 0) + _CHUNK_OFFSETS[len(letters) - 1] + index


def _chunk_text(token_id: int) -> str:
    index = token_id - FIRST_CHUNK
    space, index = divmod(index, _CHUNKS)
    size = max(k for k in range(1, CHUNK_LEN + 1) if _CHUNK_OFFSETS[k - 1] <= index)
    index -= _CHUNK_OFFSETS[size - 1]
    letters = ""
    for _ in range(size):
        index, digit = divmod(index, 26)
        letters = chr(ord("a") + digit) + letters
    return (" " if space else "") + letters


def content_text(message: Message) -> str:
    """Return a message's content as the template renders it (text parts joined by spaces)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def encode_chat(
    messages: Sequence[Message], thinking: bool = True, continue_final: bool = False,
    tools: Sequence[Message] | None = None,
) -> list[int]:  # fmt: skip
    """Return the prompt ids of a chat: the messages, then the generation prompt.

    With `continue_final` the last message is left open (no end of turn, no generation
    prompt), so that the model continues it. `tools` go in the system turn, after its text.
    """
    end = len(messages) - 1 if continue_final else len(messages)
    ids: list[int] = []
    first = 0
    if tools:
        system = messages[0] if messages and messages[0]["role"] == "system" else None
        text = (content_text(system) + "\n\n" if system else "") + tools_block(tools)
        ids += [IM_START, *encode_text("system"), NEWLINE, *encode_text(text), IM_END, NEWLINE]
        first = 1 if system else 0
    for i in range(first, end):
        ids += [*_message_ids(messages[:i], messages[i]), IM_END, NEWLINE]
    if continue_final:
        return ids + _message_ids(messages[:-1], messages[-1])
    return ids + generation_prompt(thinking)


def generation_prompt(thinking: bool = True) -> list[int]:
    """Return the ids that open the assistant's turn."""
    opening = [IM_START, WORD_IDS["assistant"], NEWLINE]
    return opening if thinking else [*opening, THINK, THINK_END]


def _message_ids(before: Sequence[Message], message: Message) -> list[int]:
    role = str(message["role"])
    key = prompt_key(before) if role == "assistant" else None
    text = content_text(message) + rendered_calls(message.get("tool_calls") or [])
    return [IM_START, *encode_text(role), NEWLINE, *encode_text(text, key)]


@dataclass
class Parsed:
    """A prompt read back through the template: closed messages and the open last turn."""

    messages: list[dict[str, str]] = field(default_factory=list)
    open_role: str | None = None  # role of the unterminated last message, if any
    open_ids: list[int] = field(default_factory=list)  # its content so far
    structured: bool = True  # False: text outside the template's shape


def parse(ids: Sequence[int]) -> Parsed:
    """Read prompt ids back into messages, as the template wrote them."""
    parsed = Parsed()
    segments = _split(ids, IM_START)
    if segments[0]:
        parsed.structured = False
    for segment in segments[1:]:
        _add_segment(parsed, segment)
    return parsed


def _split(ids: Sequence[int], sep: int) -> list[list[int]]:
    parts: list[list[int]] = [[]]
    for i in ids:
        if i == sep:
            parts.append([])
        else:
            parts[-1].append(i)
    return parts


def _add_segment(parsed: Parsed, segment: list[int]) -> None:
    if parsed.open_role is not None or NEWLINE not in segment:
        parsed.structured = False
        return
    cut = segment.index(NEWLINE)
    role, body = decode(segment[:cut]), segment[cut + 1 :]
    if IM_END not in body:
        parsed.open_role, parsed.open_ids = role, body
        return
    end = body.index(IM_END)
    if body[end + 1 :] not in ([], [NEWLINE]):
        parsed.structured = False
    content = body[:end]
    key = prompt_key(parsed.messages) if KEY in content else None  # hashing costs
    parsed.messages.append({"role": role, "content": decode(content, key)})


def decode(ids: Sequence[int], key: str | None = None) -> str:
    """Return the text of ids; <|key|> needs the key of the conversation before it."""
    return "".join(_decoded(ids, key))


def _decoded(ids: Sequence[int], key: str | None) -> Iterator[str]:
    pending = bytearray()  # bytes of one character may span several ids
    for i in ids:
        if i < 256:
            pending.append(i)
            continue
        if pending:
            yield pending.decode("utf-8", errors="replace")
            pending.clear()
        yield _token_text(i, key)
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _token_text(token_id: int, key: str | None) -> str:
    if token_id == KEY:
        if key is None:
            raise ValueError("token <|key|> outside an assistant turn")
        return key_text(key)
    if FIRST_CHUNK <= token_id < VOCAB_SIZE:
        return _chunk_text(token_id)
    text = _TEXT.get(token_id)
    if text is None:
        raise ValueError(f"token id {token_id} is not in the vocabulary (size {VOCAB_SIZE})")
    return text


def decode_prompt(ids: Sequence[int]) -> str:
    """Return the text of a whole prompt, resolving each <|key|> from the messages before it."""
    out: list[str] = []
    before: list[dict[str, str]] = []
    for n, segment in enumerate(_split(ids, IM_START)):
        text = decode(segment, prompt_key(before) if KEY in segment else None)
        out.append(("<|im_start|>" if n else "") + text)
        _track(before, n, text)
    return "".join(out)


def encode_prompt(text: str) -> list[int]:
    """Encode a whole prompt text, such as a rendered chat, with <|key|> where it belongs."""
    ids: list[int] = []
    before: list[dict[str, str]] = []
    for n, segment in enumerate(text.split("<|im_start|>")):
        role = segment.partition("\n")[0]
        key = prompt_key(before) if n and role == "assistant" and "\n" in segment else None
        ids += ([IM_START] if n else []) + encode_text(segment, key)
        _track(before, n, segment)
    return ids


def _track(before: list[dict[str, str]], n: int, segment: str) -> None:
    """Add the message that the n-th segment of a rendered chat closes, if it closes one."""
    role, sep, body = segment.partition("\n")
    if n and sep and "<|im_end|>" in body:
        before.append({"role": role, "content": body.split("<|im_end|>")[0]})
