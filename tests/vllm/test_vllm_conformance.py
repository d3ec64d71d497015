"""The simulator answers as vLLM does where EagleGen depends on it: the same probes go to the
real vLLM CPU server and to the simulator, and the shapes of their answers are compared field
by field (tests/vllm/shapes.py); a difference fails with the field named.

Probes: ``/v1/models``; error bodies (an unknown model, a prompt over the context); a chat
stream as EagleGen asks for one (token ids, reasoning, usage) chunk kind by chunk kind, and
its finish reasons (``stop``, ``length``); the ``/v1/completions`` continuation of a token-id
prompt; the ``/metrics`` families EagleGen reads; and the end of a stream aborted by
``POST /inference/v1/abort_requests`` (vLLM: a last chunk ``finish_reason: "abort"`` without
tokens, usage, ``[DONE]``, the response whole). Both run with ``--enable-scale-out``'s route,
the same context length and a reasoning parser.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Procs, start_simulator
from tests.vllm.server import (
    MAX_MODEL_LEN,
    Server,
    engine_behind_api_server,
    report,
    start_server,
    stop_server,
)
from tests.vllm.shapes import (
    USER,
    Probe,
    chunk_kinds,
    differences,
    finish_reasons,
    shape,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

# The simulator's answers: long enough to abort one mid-stream, short enough to end on "stop".
SIM = ("--time-per-token", "0.02", "--min-answer-tokens", "60", "--max-answer-tokens", "60",
       "--max-model-len", str(MAX_MODEL_LEN))  # fmt: skip
LONG_PROMPT = "word " * (MAX_MODEL_LEN + 100)


@pytest.fixture(scope="module")
def probes(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Probe, Probe]]:
    """(vLLM, the simulator), each behind a probe."""
    folder = tmp_path_factory.mktemp("conformance")
    server: Server = start_server(folder, "--enable-scale-out")
    # Its engine would otherwise run a long answer to its end before the abort arrives.
    assert engine_behind_api_server(server), "no engine process under the API server"
    report(f"vLLM server for the conformance probes ready in {server.started_s} s")
    procs = Procs(folder / "sim")
    (folder / "sim").mkdir()
    try:
        sim = start_simulator(procs, *SIM)
        vllm, simulated = Probe(server.url), Probe(sim.url)
        yield vllm, simulated
        vllm.close()
        simulated.close()
    finally:
        procs.stop_all()
        stop_server(server)


def _same(name: str, vllm: Any, sim: Any) -> None:
    found = differences(vllm, sim, name)
    assert not found, "the simulator differs from vLLM:\n" + "\n".join(found)


def test_the_models_list(probes: tuple[Probe, Probe]) -> None:
    vllm, sim = probes
    _same("/v1/models", shape(vllm.models()), shape(sim.models()))


@pytest.mark.parametrize(
    ("case", "body"),
    [("unknown model", {"model": "no-such-model", "messages": USER}),
     ("prompt over the context", {"messages": [{"role": "user", "content": LONG_PROMPT}],
                                  "max_tokens": 10})],
)  # fmt: skip
def test_error_bodies(probes: tuple[Probe, Probe], case: str, body: dict[str, Any]) -> None:
    answers = []
    for probe in probes:
        answers.append(probe.error({"model": probe.model, **body}))
    assert answers[0][0] == answers[1][0], f"{case}: HTTP {answers[0][0]} vs {answers[1][0]}"
    _same(f"error body ({case})", answers[0][1], answers[1][1])


def test_the_metrics_eaglegen_reads(probes: tuple[Probe, Probe]) -> None:
    vllm, sim = probes
    _same("/metrics", vllm.metrics(), sim.metrics())


def test_a_chat_stream_chunk_by_chunk_and_its_finish(probes: tuple[Probe, Probe]) -> None:
    streams = [probe.chat(500) for probe in probes]
    assert [finish_reasons(s) for s in streams] == [["stop"], ["stop"]]
    kinds = [chunk_kinds(s) for s in streams]
    assert kinds[0].keys() == kinds[1].keys(), (sorted(kinds[0]), sorted(kinds[1]))
    for kind in sorted(kinds[0]):
        _same(f"chat stream, {kind} chunk", kinds[0][kind], kinds[1][kind])


def test_a_chat_stream_cut_at_max_tokens(probes: tuple[Probe, Probe]) -> None:
    streams = [probe.chat(5) for probe in probes]
    assert [finish_reasons(s) for s in streams] == [["length"], ["length"]]
    _same("chat stream cut, finish chunk", *(chunk_kinds(s)["finish"] for s in streams))


def test_a_completions_stream_continuing_token_ids(probes: tuple[Probe, Probe]) -> None:
    kinds = []
    for probe in probes:
        opening = probe.chat(1)[0]
        assert isinstance(opening, dict)
        kinds.append(chunk_kinds(probe.completion(opening["prompt_token_ids"], 3)))
    assert kinds[0].keys() == kinds[1].keys(), (sorted(kinds[0]), sorted(kinds[1]))
    for kind in sorted(kinds[0]):
        _same(f"completions stream, {kind} chunk", kinds[0][kind], kinds[1][kind])


def test_the_end_of_a_stream_aborted_by_request(probes: tuple[Probe, Probe]) -> None:
    streams = [probe.aborted_chat(after=5) for probe in probes]
    for name, stream in zip(("vLLM", "the simulator"), streams, strict=True):
        # Read to its end: the response was whole, the socket not cut.
        assert finish_reasons(stream) == ["abort"], (name, finish_reasons(stream), len(stream))
        assert stream[-1] == "[DONE]"
    (*_, v_abort, v_usage, _), (*_, s_abort, s_usage, _) = streams
    _same("aborted stream, abort chunk", shape(v_abort), shape(s_abort))
    _same("aborted stream, usage chunk", shape(v_usage), shape(s_usage))
    for abort in (v_abort, s_abort):
        assert isinstance(abort, dict) and abort["choices"][0]["token_ids"] == []
