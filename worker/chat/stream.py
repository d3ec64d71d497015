"""The one decoder of a streamed completion: bytes in, the turn (or its checkpoint) out.

:class:`TurnStream` reads a chat completion's server-sent events, :class:`CompletionStream` the
``/v1/completions`` stream that continues a turn exactly from its ids. Pure: no HTTP, no Redis,
so the decoder is tested and benchmarked on recorded bytes (bench/bench_client.py).
"""

from __future__ import annotations

import json
from typing import Any

from common import errors
from common.models import Checkpoint, TurnResult, Usage
from worker.chat.reasoning import THINK_CLOSE, continue_text, finish_text
from worker.chat.tool_calls import ToolCallParts

# The JSON scanner at an offset (json.loads would first copy the payload out and re-check it).
_scan = json.JSONDecoder().raw_decode
# One server-sent event at most (bytes): the last chunk of a long prompt's ids is the biggest.
MAX_EVENT = 16 << 20


class TurnStream:
    """One streamed chat completion read from its bytes: events, deltas, ids, usage.

    The one decoder of a stream. Each read's complete events are decoded to text once, split
    on blank lines, and each ``data: {...}`` payload is parsed in place by the JSON scanner
    (``raw_decode`` at its offset: no slice, no line objects, no per-chunk objects); deltas are
    appended to lists. Other event shapes (several ``data`` lines, comments, CRLF framing)
    take a slower general path. The CPU per token bounds how many streams a worker holds.

    Hostile answers are bounded: an event still open after ``max_event`` bytes is a
    BadResponse (its parts are kept apart until its end arrives, never re-copied); each field
    read is type-checked where it is used (a wrong type raises here, and the client maps it to
    BadResponse). Ids that disagree with the text (a chunk with text and no ids, or fewer ids
    than ``usage.completion_tokens``) are dropped from the turn and its checkpoints, with the
    reason in ``ids_dropped``; fields this decoder does not read (``tool_calls``) are left be.
    """

    # Whether the text is the model's raw output (/v1/completions: no reasoning parser).
    raw = False
    max_event = MAX_EVENT  # bytes; the client sets EAGLEGEN_MAX_EVENT_BYTES

    def __init__(
        self, endpoint: str, model: str = "", turn: int = 0, resume: Checkpoint | None = None,
        discarded: int = 0,
    ) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.model = model
        self.turn = turn
        self.resume = resume  # the checkpoint this stream continues, if any
        self.resumed = resume.tokens if resume is not None else 0
        # Tokens of the turn's earlier attempts set aside: carried on in its checkpoints.
        self.discarded = resume.discarded_tokens if resume is not None else discarded
        self.done = False  # [DONE] seen: what follows is read (keep-alive) but not parsed
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.token_ids: list[int] = []
        self.prompt_token_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.text_chunks = 0
        self.server_id = ""  # the request's id on the server: the first chunk's ``id``
        # Ids received up to the last chunk with text: a checkpoint ends there, so that its
        # text and ids agree (a token held back by the detokenizer, or a trailing end-of-turn
        # or end-of-reasoning token, is generated again rather than continued from).
        self.text_ids = 0
        self.tool_calls: ToolCallParts | None = None  # made by the first tool-call fragment
        self.unmarked = 0  # chunks with text and no ids
        self.ids_dropped: str | None = None  # why the ids were found wrong, once they were
        self._checked = 0  # ids known to be ints
        self._parts: list[bytes] = []  # an event not yet ended, as it arrived
        self._waiting = 0  # its bytes

    def feed(self, data: bytes) -> None:
        """Parse the events that arrived; an incomplete one waits for the next read."""
        if self.done:
            return
        if self._parts:
            if not _ends_event(self._parts[-1], data):
                self._wait(data)
                return
            buf = b"".join([*self._parts, data])
            self._parts, self._waiting = [], 0
        else:
            buf = data
        if b"\r" in buf:  # CRLF framing; a CR at the end of a read meets its LF next time
            buf = buf.replace(b"\r\n", b"\n")
        cut = buf.rfind(b"\n\n") + 2
        if cut < 2:
            self._wait(buf)
            return
        if cut < len(buf):
            self._wait(buf[cut:])
        # Whole events only: no UTF-8 character is split at the cut.
        text = (buf[:cut] if cut < len(buf) else buf).decode()
        start = 0
        while not self.done:
            end = text.find("\n\n", start)
            if end < 0:
                break
            if text.startswith("data: {", start) and text.find("\n", start, end) < 0:
                chunk, stop = _scan(text, start + 6)  # how every server sends chunks
                if stop != end and (stop > end or text[stop:end].strip()):
                    raise ValueError(f"an event is not one JSON object: {text[start:end][:99]!r}")
                self._add(chunk)
            else:
                self._event(text[start:end])
            start = end + 2

    def _wait(self, part: bytes) -> None:
        self._parts.append(part)
        self._waiting += len(part)
        if self._waiting > self.max_event:
            raise errors.BadResponse(
                f"{self.endpoint}: a server-sent event over {self.max_event} bytes "
                "(EAGLEGEN_MAX_EVENT_BYTES)"
            )

    def _event(self, block: str) -> None:
        payload = _data_field(block)
        if payload is None:
            return
        if payload.strip() == "[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            raise ValueError(f"a stream event is not a JSON object: {payload[:80]!r}")
        self._add(chunk)

    def _add(self, chunk: dict[str, Any]) -> None:
        if not self.server_id:
            self.server_id = str(chunk.get("id") or "")
        choices = chunk.get("choices")
        if choices:
            if type(choices) is not list:
                raise _wrong("choices", choices)
            for choice in choices:
                if type(choice) is not dict:
                    raise _wrong("a choice", choice)
                self._add_choice(choice)
        elif chunk.get("error"):
            raise errors.ServerError(f"{self.endpoint}: error in the stream: {chunk['error']}")
        prompt = chunk.get("prompt_token_ids")
        if prompt is not None:
            self._prompt_ids(prompt)
        usage = chunk.get("usage")
        if usage:
            if type(usage) is not dict:
                raise _wrong("usage", usage)
            self.usage = usage

    def _add_choice(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if ids:
            if type(ids) is list:
                self.token_ids += ids  # each an int: checked once per id, in _ids
            else:
                self.ids_dropped = "are not lists"
        if self._add_text(choice):
            self.text_chunks += 1
            self.text_ids = len(self.token_ids)
            if not ids:
                self.unmarked += 1
        reason = choice.get("finish_reason")
        if reason:
            if type(reason) is not str:
                raise _wrong("finish_reason", reason)
            self.finish_reason = reason

    def _add_text(self, choice: dict[str, Any]) -> bool:
        """Keep a choice's text; whether it had any. Chat: the delta's answer and reasoning."""
        delta = choice.get("delta")
        if not delta:
            return False
        if type(delta) is not dict:
            raise _wrong("delta", delta)
        text = delta.get("content")
        if text:
            if type(text) is not str:
                raise _wrong("content", text)
            self.content.append(text)
        # vLLM now sends `reasoning`; SGLang and older vLLM `reasoning_content`.
        thought = delta.get("reasoning") or delta.get("reasoning_content")
        if thought:
            if type(thought) is not str:
                raise _wrong("reasoning", thought)
            self.reasoning.append(thought)
        calls = delta.get("tool_calls")
        if calls:
            self.tool_calls = self.tool_calls or ToolCallParts()
            self.tool_calls.add(calls)
        return bool(text or thought or calls)

    def tokens(self) -> int:
        """Tokens received so far: the ids where given, else ~1 per text chunk."""
        return len(self.token_ids) or self.text_chunks

    def result(self, latency: float, model: str) -> TurnResult:
        """The finished turn; a stream without a finish or with an empty answer is an error."""
        if self.finish_reason is None:
            raise errors.Disconnected(f"{self.endpoint}: stream ended without a finish_reason")
        streamed_reasoning, streamed = self._texts()
        reasoning, content = finish_text(streamed, streamed_reasoning)
        calls = self.tool_calls.calls() if self.tool_calls else None
        serialised = self.tool_calls.serialised if self.tool_calls else 0
        if not (content.strip() or reasoning or calls) and self.finish_reason != "length":
            raise errors.EmptyResponse(f"{self.endpoint}: the model returned an empty answer")
        prompt_ids, ids = self._ids(len(self.token_ids))
        return TurnResult(
            content=content, reasoning=reasoning, finish_reason=self.finish_reason,
            usage=self._usage(), latency_s=round(latency, 3), endpoint=self.endpoint,
            model=model, prompt_token_ids=prompt_ids, token_ids=ids,
            resumed_from_tokens=self.resumed, tool_calls=calls,
            token_ids_dropped=self.ids_dropped, discarded_tokens=self.discarded or None,
            tool_arguments_serialised=serialised or None,
        )  # fmt: skip

    def finished(self) -> TurnResult:
        """The resumed turn when its checkpoint had already used up max_tokens."""
        assert self.resume is not None
        self.finish_reason = "length"
        self.prompt_token_ids = self.resume.prompt_token_ids  # no new ids, and none missing
        return self.result(0.0, self.model)

    def checkpoint(self) -> Checkpoint | None:
        """What the turn has generated so far, what it resumed from included; None if nothing.

        Ends at the last chunk with text (see ``text_ids``). A resumed stream that got
        nothing new gives back the checkpoint it started from.
        """
        return self._checkpoint_upto(len(self.content), self.text_ids, self.text_chunks)

    def _checkpoint_upto(self, pieces: int, text_ids: int, chunks: int) -> Checkpoint | None:
        """The checkpoint of the first ``pieces`` of content, ``text_ids`` ids, ``chunks``
        chunks with text."""
        if not chunks:
            return self.resume
        reasoning, content = self._texts(pieces)
        prompt_ids, ids = self._ids(text_ids)
        new = text_ids if self.prompt_token_ids is not None else chunks
        return Checkpoint(
            turn=self.turn, endpoint=self.endpoint, model=self.model,
            prompt_token_ids=prompt_ids, token_ids=ids, content=content, reasoning=reasoning,
            tokens=self.resumed + new, resumed_from_tokens=self.resumed,
            discarded_tokens=self.discarded,
        )  # fmt: skip

    def _texts(self, pieces: int | None = None) -> tuple[str, str]:
        """(reasoning, content) so far (of the first ``pieces`` of content), as streamed:
        inline reasoning tags not yet split."""
        reasoning, content = "".join(self.reasoning), "".join(self.content[:pieces])
        if self.resume is None:
            return reasoning, content
        resume = self.resume
        return continue_text(resume.reasoning, resume.content, reasoning, content, self.raw)

    def _ids(self, end: int) -> tuple[list[int] | None, list[int] | None]:
        """(prompt ids, completion ids up to ``end`` of this stream's): the original prompt's
        and the whole turn's, or (None, None) where the server gave none or they are wrong."""
        if self.prompt_token_ids is None or not self._ids_agree():
            return None, None
        if self.resume is None:
            return self.prompt_token_ids, self.token_ids[:end]
        prompt, before = self.resume.prompt_token_ids, self.resume.token_ids
        if prompt is None or before is None:
            return None, None
        return prompt, before + self.token_ids[:end]

    def _prompt_ids(self, ids: object) -> None:
        if type(ids) is list and all(type(i) is int for i in ids):
            self.prompt_token_ids = ids
        else:
            self.prompt_token_ids = []  # the server gives ids, wrong ones: the turn's are dropped
            self.ids_dropped = "hold a prompt that is not a list of integers"

    def _ids_agree(self) -> bool:
        """Whether the ids so far can be trusted; once not, the reason is in ``ids_dropped``."""
        if self.ids_dropped is None:
            self.ids_dropped = self._ids_problem()
        return self.ids_dropped is None

    def _ids_problem(self) -> str | None:
        ids = self.token_ids
        if not all(type(i) is int for i in ids[self._checked :]):
            return "are not all integers"  # "123" would have been spread into "1", "2", "3"
        self._checked = len(ids)
        if self.unmarked:
            return f"are missing from {self.unmarked} of {self.text_chunks} chunks with text"
        done = self.usage.get("completion_tokens")
        if self.finish_reason is not None and type(done) is int and done != len(ids):
            return f"number {len(ids)}, usage.completion_tokens {done}"
        return None

    def _usage(self) -> Usage:
        """The turn's usage: a resumed turn counts what it resumed from as generated by it,
        and its prompt is the original one, not the continuation's."""
        prompt = self.usage.get("prompt_tokens") or 0
        done = self.usage.get("completion_tokens") or 0
        if type(prompt) is not int or type(done) is not int:
            raise _wrong("usage", self.usage)
        resume = self.resume
        if resume is None:
            return Usage(prompt_tokens=prompt, completion_tokens=done)
        if resume.prompt_token_ids is not None:
            prompt = len(resume.prompt_token_ids)
        else:  # the continuation's prompt held the partial text: about its tokens more
            prompt = max(0, prompt - resume.tokens)
        return Usage(prompt_tokens=prompt, completion_tokens=resume.tokens + done)


def _wrong(field: str, value: object) -> errors.BadResponse:
    """A field of the wrong type; the value, shortened, for the reason."""
    return errors.BadResponse(f"{field} is a {type(value).__name__}: {str(value)[:60]!r}")


def _ends_event(last: bytes, data: bytes) -> bool:
    """Whether ``data`` ends the event whose last part so far is ``last`` (no blank line in it)."""
    if b"\n\n" in data or b"\n\r\n" in data:
        return True
    seam = last[-3:] + data[:3]
    return b"\n\n" in seam or b"\n\r\n" in seam


class CompletionStream(TurnStream):
    """A streamed /v1/completions (the exact continuation of a turn): raw text in
    ``choices[].text``; vLLM puts the ids in the choice, the prompt ids in the first one's.

    Nothing of it is kept unless it is proven a continuation: the server must echo the prompt
    ids it was sent (``return_token_ids``). A server that ignores a token-id prompt answers
    afresh, and that answer joined to the saved partial would be a record that looks right and
    is not; so the first text (or the finish) without the echo raises :class:`NotContinued`.
    """

    raw = True

    def __init__(
        self, endpoint: str, model: str, turn: int, resume: Checkpoint, sent: list[int]
    ) -> None:
        super().__init__(endpoint, model, turn, resume)
        self.sent = sent  # the token-id prompt the continuation was asked for
        self.proven = False
        # (content pieces, text ids, chunks with text) before the last chunk with text
        self._before_last = (0, 0, 0)

    def _add_text(self, choice: dict[str, Any]) -> bool:
        prompt = choice.get("prompt_token_ids")
        if prompt is not None:
            self._prompt_ids(prompt)
        text = choice.get("text")
        if text:
            if type(text) is not str:
                raise _wrong("text", text)
            self.prove()
            self._before_last = (len(self.content), self.text_ids, self.text_chunks)
            self.content.append(text)
        return bool(text)

    def checkpoint(self) -> Checkpoint | None:
        """As a chat stream's, but never ending on the end-of-reasoning marker: in raw text, a
        checkpoint of reasoning that ends there reads as reasoning still open, and the answer
        continued from it would be counted as reasoning. It ends before that chunk instead
        (the marker is generated again, as a chat stream's is)."""
        assert self.resume is not None
        in_reasoning = self.resume.reasoning and not self.resume.content
        if in_reasoning and self.content and self.content[-1].endswith(THINK_CLOSE):
            return self._checkpoint_upto(*self._before_last)
        return super().checkpoint()

    def prove(self) -> None:
        """Raise unless the server echoed exactly the prompt it was sent."""
        if self.proven:
            return
        if self.prompt_token_ids != self.sent:
            echoed = "no prompt ids" if self.prompt_token_ids is None else "other prompt ids"
            raise errors.NotContinued(
                f"{self.endpoint}: /v1/completions echoed {echoed}: the answer is not a "
                "continuation of the token-id prompt"
            )
        self.proven = True

    def result(self, latency: float, model: str) -> TurnResult:
        self.prove()
        return super().result(latency, model)


def _data_field(block: str) -> str | None:
    """The data of a general server-sent event: its ``data`` lines joined; None if it has none.

    Comments (``:``) and other fields (``event``, ``id``, ``retry``) are skipped.
    """
    lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
    return "\n".join(lines) if lines else None
