"""The client's side of exact resume: checkpoints while streaming and on a break, continuations.

Real simulators over loopback HTTP (the in-process uvicorn of test_simulator_server): one
answers unbroken, the other drops each prompt's first attempt after ``cut_at`` tokens
(``disconnect_first``); the checkpoint the broken stream left is continued, and the turn must
equal the unbroken one: ids, text, reasoning/answer split, finish reason, usage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common import errors
from common.models import Checkpoint, GenParams, TurnResult
from common.settings import Settings
from simulator.answers import expected_answer
from simulator.config import SimConfig
from simulator.tokenizer import THINK_END
from tests.test_simulator_server import Sim, sim, start_sim
from worker.chat.client import COMPLETIONS_REFUSALS, ChatClient
from worker.chat.reasoning import continue_text, partial_message
from worker.chat.stream import CompletionStream

__all__ = ["sim", "start_sim"]  # fixtures shared with test_simulator_server

ONE = {"fast_chunk_tokens": 1}  # one token per chunk, as vLLM streams


def ask(text: str = "Resume me, please") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def clients() -> Iterator[Callable[..., ChatClient]]:
    made: list[ChatClient] = []

    def make(sim: Sim, **settings: Any) -> ChatClient:
        endpoint = f"{sim.url}/v1"
        client = ChatClient(endpoint, Settings(endpoints=[endpoint], **settings))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def broken(client: ChatClient, messages: list[dict[str, Any]], params: GenParams) -> Checkpoint:
    """The checkpoint of a turn whose stream the server dropped."""
    with pytest.raises(errors.Disconnected) as caught:
        client.complete(messages, params, turn=0)
    assert caught.value.checkpoint is not None
    assert caught.value.tokens_streamed > 0
    return caught.value.checkpoint


def same_turn(resumed: TurnResult, unbroken: TurnResult, resumed_from: int) -> None:
    assert resumed.token_ids == unbroken.token_ids
    assert resumed.prompt_token_ids == unbroken.prompt_token_ids
    assert (resumed.reasoning, resumed.content) == (unbroken.reasoning, unbroken.content)
    assert resumed.finish_reason == unbroken.finish_reason
    assert resumed.usage == unbroken.usage
    assert resumed.resumed_from_tokens == resumed_from > 0
    assert unbroken.resumed_from_tokens == 0


def cuts(unbroken: TurnResult) -> dict[str, int]:
    """Where to break the stream: in the reasoning, right after </think>, in the answer."""
    assert unbroken.token_ids is not None
    close = unbroken.token_ids.index(THINK_END)
    return {"reasoning": max(2, close // 2), "boundary": close + 1, "content": close + 4}


# --- exact: /v1/completions from the ids ----------------------------------------------------


@pytest.mark.parametrize("where", ["reasoning", "boundary", "content"])
def test_a_broken_turn_resumed_from_its_ids_equals_the_unbroken_one(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient], where: str
) -> None:
    params = GenParams()
    unbroken = clients(start_sim(**ONE)).complete(ask(), params)
    k = cuts(unbroken)[where]
    sim = start_sim(disconnect_first=1, cut_at=k, **ONE)
    client = clients(sim)
    checkpoint = broken(client, ask(), params)
    # A checkpoint ends on a token with text: cut right after </think>, it ends before it.
    settled = k - 1 if where == "boundary" else k
    assert unbroken.token_ids is not None
    assert checkpoint.token_ids == unbroken.token_ids[:settled]
    assert checkpoint.prompt_token_ids == unbroken.prompt_token_ids
    assert checkpoint.tokens == settled and checkpoint.resumed_from_tokens == 0
    assert (checkpoint.reasoning + checkpoint.content).strip()
    resumed = client.complete(ask(), params, turn=0, resume=checkpoint)
    same_turn(resumed, unbroken, settled)
    assert client.completions is True and client.continues() is True
    # No token generated twice, bar the one a boundary checkpoint left out.
    assert sim.stats()["tokens_generated"] == len(unbroken.token_ids) + (k - settled)


def test_a_turn_broken_twice_resumes_from_its_second_checkpoint(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    params = GenParams()
    unbroken = clients(start_sim(**ONE)).complete(ask(), params)
    assert unbroken.token_ids is not None
    sim = start_sim(disconnect_first=2, cut_at=5, **ONE)  # the continuation is dropped too
    client = clients(sim)
    first = broken(client, ask(), params)
    with pytest.raises(errors.Disconnected) as caught:
        client.complete(ask(), params, resume=first)
    second = caught.value.checkpoint
    assert second is not None and second.resumed_from_tokens == first.tokens
    assert first.tokens < second.tokens <= first.tokens + 5
    assert second.token_ids == unbroken.token_ids[: second.tokens]
    assert caught.value.tokens_streamed == 5  # this request's own, not the resumed ones
    resumed = client.complete(ask(), params, resume=second)
    same_turn(resumed, unbroken, second.tokens)


@pytest.mark.parametrize("cut", range(2, 14))
def test_a_turn_broken_twice_around_the_end_of_its_reasoning_keeps_its_split(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient], cut: int
) -> None:
    # Cut every `cut` tokens twice: for some cut the continuation (raw text on
    # /v1/completions) breaks right after the end-of-reasoning marker. A checkpoint ending on
    # the marker would read as reasoning still open, and the answer would become reasoning.
    params = GenParams()
    unbroken = clients(start_sim(**ONE)).complete(ask(), params)
    client = clients(start_sim(disconnect_first=2, cut_at=cut, **ONE))
    first = broken(client, ask(), params)
    try:
        resumed = client.complete(ask(), params, resume=first)
    except errors.Disconnected as exc:
        assert exc.checkpoint is not None
        resumed = client.complete(ask(), params, resume=exc.checkpoint)
    assert (resumed.reasoning, resumed.content) == (unbroken.reasoning, unbroken.content)
    assert resumed.token_ids == unbroken.token_ids


def test_a_resumed_turn_stops_at_the_same_length_as_the_unbroken_one(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    params = GenParams(max_tokens=9)
    unbroken = clients(start_sim(**ONE)).complete(ask("cut short"), params)
    assert unbroken.finish_reason == "length" and unbroken.token_ids is not None
    assert len(unbroken.token_ids) == 9
    sim = start_sim(disconnect_first=1, cut_at=4, **ONE)
    client = clients(sim)
    checkpoint = broken(client, ask("cut short"), params)
    resumed = client.complete(ask("cut short"), params, turn=0, resume=checkpoint)
    same_turn(resumed, unbroken, checkpoint.tokens)
    assert sim.stats()["tokens_generated"] == 9 + (4 - checkpoint.tokens)


def test_a_checkpoint_that_used_up_max_tokens_is_finished_without_a_request(
    sim: Sim, clients: Callable[..., ChatClient]
) -> None:
    params = GenParams(max_tokens=6)
    client = clients(sim)
    unbroken = client.complete(ask("tiny"), params)
    assert unbroken.token_ids is not None and unbroken.prompt_token_ids is not None
    checkpoint = Checkpoint(
        turn=0, endpoint=client.endpoint, model=unbroken.model,
        prompt_token_ids=unbroken.prompt_token_ids, token_ids=unbroken.token_ids,
        reasoning=unbroken.reasoning or "", content=unbroken.content, tokens=6,
    )  # fmt: skip
    requests = sim.stats()["requests"]
    resumed = client.complete(ask("tiny"), params, turn=0, resume=checkpoint)
    assert sim.stats()["requests"] == requests
    same_turn(resumed, unbroken, 6)


def test_resume_off_generates_the_turn_again(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    sim = start_sim(disconnect_first=1, cut_at=5, **ONE)
    checkpoint = broken(clients(sim), ask(), GenParams())
    again = clients(sim, resume="off").complete(ask(), GenParams(), resume=checkpoint)
    assert again.resumed_from_tokens == 0
    assert again.token_ids is not None
    assert sim.stats()["tokens_generated"] == 5 + len(again.token_ids)


# --- text: continue_final_message -----------------------------------------------------------


def _cut_point(where: str) -> int:
    """A cut in the reasoning or in the answer of ``ask()``'s legacy (id-less) stream."""
    answer = expected_answer(ask(), None, SimConfig())
    if where == "reasoning":
        return max(1, len(answer.reasoning_tokens) // 2)
    return len(answer.reasoning_tokens) + 3  # legacy streams: no tag tokens


@pytest.mark.parametrize("where", ["reasoning", "content"])
@pytest.mark.parametrize("parser", ["reasoning", "inline"])
def test_a_turn_without_ids_resumes_from_its_text_where_the_server_proved_it_continues(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient], where: str, parser: str
) -> None:
    # Ids off by setting; the server echoes prompt ids, so its continuations can be proven.
    server: dict[str, Any] = {"reasoning_field": parser}
    params = GenParams()
    unbroken = clients(start_sim(**server, **ONE), token_ids="off").complete(ask(), params)
    assert unbroken.token_ids is None and unbroken.reasoning
    k = _cut_point(where)
    client = clients(start_sim(disconnect_first=1, cut_at=k, **server, **ONE), token_ids="off")
    checkpoint = broken(client, ask(), params)
    assert checkpoint.token_ids is None and checkpoint.tokens == k
    if parser == "reasoning":
        assert bool(checkpoint.content) == (where == "content")
    resumed = client.complete(ask(), params, turn=0, resume=checkpoint)
    assert client.chat_continues is True
    assert (resumed.reasoning, resumed.content) == (unbroken.reasoning, unbroken.content)
    assert resumed.finish_reason == "stop" and resumed.resumed_from_tokens == k
    assert resumed.token_ids is None and resumed.usage.completion_tokens > k


@pytest.mark.parametrize("where", ["reasoning", "content"])
def test_a_server_that_cannot_prove_a_continuation_starts_the_turn_again(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient], where: str
) -> None:
    # No token ids at all (like SGLang or a hosted API): no echo of the prompt, no proof.
    params = GenParams()
    unbroken = clients(start_sim(token_ids=False, **ONE)).complete(ask(), params)
    k = _cut_point(where)
    client = clients(start_sim(token_ids=False, disconnect_first=1, cut_at=k, **ONE))
    checkpoint = broken(client, ask(), params)
    again = client.complete(ask(), params, turn=0, resume=checkpoint)
    assert client.chat_continues is False
    assert (again.reasoning, again.content) == (unbroken.reasoning, unbroken.content)
    assert again.resumed_from_tokens == 0 and again.discarded_tokens == k


def test_a_server_that_refuses_token_id_prompts_and_echoes_no_ids_starts_the_turn_again(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    params = GenParams()
    with_ids = start_sim(disconnect_first=1, cut_at=6, **ONE)
    unbroken = clients(start_sim(**ONE)).complete(ask(), params)
    checkpoint = broken(clients(with_ids), ask(), params)
    assert checkpoint.token_ids is not None
    other = clients(start_sim(token_ids=False, **ONE))  # like SGLang: no token-id prompts
    again = other.complete(ask(), params, turn=0, resume=checkpoint)
    assert (again.reasoning, again.content) == (unbroken.reasoning, unbroken.content)
    assert again.resumed_from_tokens == 0 and again.discarded_tokens == 6
    # One refusal may be that request's own: exact resume stays on until a few in a row.
    assert other.completions is None
    for _ in range(COMPLETIONS_REFUSALS - 1):
        other.complete(ask(), params, turn=0, resume=checkpoint)
    assert other.completions is False


@pytest.mark.parametrize("ids", ["on the server", "off by setting"])
def test_a_server_that_ignores_continuations_never_gets_its_answer_joined_to_the_partial(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient], ids: str
) -> None:
    setting = {"token_ids": "off"} if ids == "off by setting" else {}
    params = GenParams()
    unbroken = clients(start_sim(**ONE), **setting).complete(ask(), params)
    checkpoint = broken(clients(start_sim(disconnect_first=1, cut_at=9, **ONE), **setting), ask(),
                        params)  # fmt: skip
    ignoring = start_sim(ignore_continuations=True, **ONE)
    client = clients(ignoring, **setting)
    again = client.complete(ask(), params, turn=0, resume=checkpoint)
    # The fresh answer, whole and alone: not the partial with a new answer after it.
    assert (again.reasoning, again.content) == (unbroken.reasoning, unbroken.content)
    assert again.token_ids == unbroken.token_ids
    assert again.resumed_from_tokens == 0 and again.discarded_tokens == 9
    assert client.chat_continues is False
    if ids == "on the server":
        assert client.completions is False  # its echoed prompt was not the one sent
    assert client.continues() is False  # routing sends its checkpoints elsewhere


def test_a_turn_set_aside_twice_counts_both_discards(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    # A checkpoint that already carries 5 tokens of an earlier attempt set aside, taken to a
    # server that ignores continuations: the new attempt's checkpoints carry those and the
    # 9 it sets aside now, and so does the turn.
    params = GenParams()
    checkpoint = broken(clients(start_sim(disconnect_first=1, cut_at=9, **ONE)), ask(), params)
    earlier = checkpoint.model_copy(update={"discarded_tokens": 5})
    progress = Recorder(every=5)
    client = clients(start_sim(ignore_continuations=True, time_per_token=0.002, **ONE))
    done = client.complete(ask(), params, turn=0, resume=earlier, progress=progress)
    assert done.resumed_from_tokens == 0 and done.discarded_tokens == 5 + 9
    assert progress.saved and all(c.discarded_tokens == 5 + 9 for c in progress.saved)


def test_a_continuation_answered_afresh_is_refused_at_its_first_text() -> None:
    resume = Checkpoint(turn=0, endpoint="e", model="m", prompt_token_ids=[1], token_ids=[2])
    stream = CompletionStream("e", "m", 0, resume, sent=[1, 2])
    with pytest.raises(errors.NotContinued):
        stream.feed(
            b'data: {"choices":[{"index":0,"text":"Fresh","token_ids":[7],'
            b'"prompt_token_ids":[1],"finish_reason":null}]}\n\n'
        )
    assert stream.content == [] and stream.checkpoint() is resume
    silent = CompletionStream("e", "m", 0, resume, sent=[1, 2])  # no echo at all
    with pytest.raises(errors.NotContinued):
        silent.feed(b'data: {"choices":[{"index":0,"text":"Fresh","finish_reason":null}]}\n\n')


def test_token_ids_on_starts_a_turn_again_rather_than_lose_its_ids(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    checkpoint = broken(clients(start_sim(disconnect_first=1, cut_at=6, **ONE)), ask(), GenParams())
    refusing = start_sim(token_ids=False, **ONE)
    with pytest.raises(errors.NoTokenIds):  # generated again from the start, and it has none
        clients(refusing, token_ids="on").complete(ask(), GenParams(), resume=checkpoint)


@pytest.mark.parametrize("field", ["inline", "reasoning_content"])
def test_other_reasoning_fields_resume_to_the_same_split(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient], field: str
) -> None:
    params = GenParams()
    unbroken = clients(start_sim(reasoning_field=field, **ONE)).complete(ask(), params)
    assert unbroken.reasoning and unbroken.content
    for where, k in cuts(unbroken).items():
        sim = start_sim(reasoning_field=field, disconnect_first=1, cut_at=k, **ONE)
        client = clients(sim)
        checkpoint = broken(client, ask(), params)
        resumed = client.complete(ask(), params, turn=0, resume=checkpoint)
        assert (resumed.reasoning, resumed.content) == (unbroken.reasoning, unbroken.content), where
        assert resumed.token_ids == unbroken.token_ids, where


# --- checkpoints while streaming, and on errors ----------------------------------------------


class Recorder:
    """A Progress that wants a checkpoint every ``every`` tokens, and keeps them."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.asked: list[int] = []
        self.saved: list[Checkpoint] = []
        self.last = 0
        self.named: list[tuple[str, str]] = []  # (endpoint, server id) per request

    def due(self, tokens: int) -> bool:
        self.asked.append(tokens)
        return tokens - self.last >= self.every

    def save(self, checkpoint: Checkpoint) -> None:
        assert self.asked and checkpoint.tokens <= self.asked[-1]
        self.saved.append(checkpoint)
        self.last = checkpoint.tokens

    def started(self, endpoint: str, server_id: str) -> None:
        self.named.append((endpoint, server_id))


def inline(saved: Checkpoint) -> str:
    """The checkpoint's text as the model wrote it, think tags inline."""
    if not saved.content:
        return f"<think>{saved.reasoning}"
    return f"<think>{saved.reasoning}</think>{saved.content}"


def raw_tokens(messages: list[dict[str, Any]], sim: Sim) -> list[str]:
    """The text of each token of the simulated answer, tags included."""
    answer = expected_answer(messages, None, sim.cfg)
    return ["<think>", *answer.reasoning_tokens, "</think>", *answer.content_tokens, ""]


def test_progress_is_asked_per_read_and_its_checkpoints_carry_what_streamed(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    sim = start_sim(time_per_token=0.002)  # every token on its own read, mostly
    progress = Recorder(every=5)
    result = clients(sim).complete(ask(), GenParams(), turn=2, progress=progress)
    assert result.token_ids is not None
    total = len(result.token_ids)
    assert progress.asked == sorted(progress.asked) and progress.asked[-1] == total
    assert len(progress.asked) > total // 2  # asked after every read, not once at the end
    assert len(progress.saved) >= total // 5 - 1
    tokens = raw_tokens(ask(), sim)
    for saved in progress.saved:
        n = saved.tokens
        assert saved.turn == 2 and saved.resumed_from_tokens == 0
        assert saved.token_ids == result.token_ids[:n]
        assert saved.prompt_token_ids == result.prompt_token_ids
        # The text is the text of exactly those ids.
        assert inline(saved) == "".join(tokens[:n])
    assert [s.tokens for s in progress.saved] == sorted({s.tokens for s in progress.saved})


def test_each_request_is_named_once_by_the_server_id_built_from_its_own_x_request_id(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    sim = start_sim(disconnect_first=1, cut_at=7)
    progress = Recorder(every=1000)
    client = clients(sim)
    with pytest.raises(errors.Disconnected) as cut:
        client.complete(ask(), GenParams(), progress=progress)
    assert cut.value.checkpoint is not None
    client.complete(ask(), GenParams(), resume=cut.value.checkpoint, progress=progress)
    (first_at, first), (again_at, again) = progress.named
    assert first_at == again_at == client.endpoint
    # Chat: chatcmpl-<X-Request-Id>; the exact continuation on /v1/completions: cmpl-<...>.
    assert first.startswith("chatcmpl-eaglegen-") and again.startswith("cmpl-eaglegen-")
    assert first.removeprefix("chat") != again  # a new X-Request-Id per request


def test_a_resumed_streams_checkpoints_include_what_it_resumed_from(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    sim = start_sim(disconnect_first=1, cut_at=7, time_per_token=0.002)
    client = clients(sim)
    checkpoint = broken(client, ask(), GenParams())
    progress = Recorder(every=5)
    progress.last = checkpoint.tokens
    result = client.complete(ask(), GenParams(), resume=checkpoint, progress=progress)
    assert result.token_ids is not None
    assert progress.asked[0] > checkpoint.tokens and progress.asked[-1] == len(result.token_ids)
    tokens = raw_tokens(ask(), sim)
    assert progress.saved
    for saved in progress.saved:
        assert saved.resumed_from_tokens == checkpoint.tokens
        assert saved.token_ids == result.token_ids[: saved.tokens]
        assert inline(saved) == "".join(tokens[: saved.tokens])


def test_no_checkpoint_when_nothing_arrived(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    sim = start_sim(fail_first=1, disconnect_first=1, cut_at=5, **ONE)
    client = clients(sim)
    with pytest.raises(errors.ServerError) as caught:
        client.complete(ask(), GenParams())
    assert caught.value.checkpoint is None and caught.value.tokens_streamed == 0
    checkpoint = broken(client, ask(), GenParams())
    # A resumed stream that breaks before anything new gives back what it resumed from.
    failing = clients(start_sim(fail_first=1, **ONE))
    with pytest.raises(errors.ServerError) as again:
        failing.complete(ask(), GenParams(), resume=checkpoint)
    assert again.value.checkpoint == checkpoint


def test_a_check_that_aborts_the_stream_leaves_a_checkpoint(
    start_sim: Callable[..., Sim], clients: Callable[..., ChatClient]
) -> None:
    sim = start_sim(time_per_token=0.002)
    reads = 0

    def check() -> None:
        nonlocal reads
        reads += 1
        if reads == 8:
            raise errors.LeaseLost("the lease moved on")

    with pytest.raises(errors.LeaseLost) as caught:
        clients(sim).complete(ask(), GenParams(), check)
    saved = caught.value.checkpoint
    assert saved is not None and saved.tokens > 0
    unbroken = clients(start_sim()).complete(ask(), GenParams())
    assert unbroken.token_ids is not None
    assert saved.token_ids == unbroken.token_ids[: saved.tokens]
    resumed = clients(sim).complete(ask(), GenParams(), resume=saved)
    same_turn(resumed, unbroken, saved.tokens)


# --- pure: the stream of /v1/completions, and the text of a continued turn -------------------


def test_a_completion_stream_reads_vllms_text_and_ids() -> None:
    resume = Checkpoint(turn=0, endpoint="e", model="m", prompt_token_ids=[1], token_ids=[2])
    stream = CompletionStream("e", "m", 0, resume, sent=[1, 2])
    stream.feed(
        b'data: {"choices":[{"index":0,"text":" so","token_ids":[7],"prompt_token_ids":[1,2],'
        b'"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"text":"</think>","token_ids":[9],'
        b'"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"text":"","token_ids":[],"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert (stream.prompt_token_ids, stream.token_ids) == ([1, 2], [7, 9])
    assert stream.content == [" so", "</think>"] and stream.finish_reason == "stop"
    assert stream.text_ids == 2


def test_a_completion_splits_an_open_reasoning_at_the_marker_as_vllms_parser_does() -> None:
    # Qwen3 writes "<think>\n...\n</think>\n\nanswer"; vLLM's parser trims nothing around the tags.
    assert continue_text("\nOkay", "", "", " so.\n</think>\n\nFour.", raw=True) == (
        "\nOkay so.\n",
        "\n\nFour.",
    )
    assert continue_text("\nOkay", "", "", " still", raw=True) == ("\nOkay still", "")
    assert continue_text("r", "\n\nFo", "", "ur.", raw=True) == ("r", "\n\nFour.")
    # A chat continuation: the parser split it, or the answer began right away.
    assert continue_text("r", "", " more", "A", raw=False) == ("r more", "A")
    assert continue_text("r", "", "", "A", raw=False) == ("r", "A")
    # No parser: the tags are in the content, split at the end as for an unbroken turn.
    assert continue_text("", "<think>r", "", "</think>A", raw=True) == ("", "<think>r</think>A")


def test_a_partial_reasoning_goes_back_inline_and_open_an_answer_with_its_reasoning_apart() -> None:
    assert partial_message("\nOkay", "") == {"role": "assistant", "content": "<think>\nOkay"}
    answer = {"role": "assistant", "content": "\n\nA", "reasoning_content": "r\n"}
    assert partial_message("r\n", "\n\nA") == answer
    # No parser: the tags were left in the content.
    assert partial_message("", "<think>r\n</think>\n\nA") == answer
    assert partial_message("", "<think>r") == {"role": "assistant", "content": "<think>r"}
    assert partial_message("", "A") == {"role": "assistant", "content": "A"}
