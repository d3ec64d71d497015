from common.models import GenParams, Sample, SourceRef, TurnResult, Usage
from worker.pipeline.generate import answer_turns, build_record, history


def _sample(turns=("q1", "q2"), system=None):
    return Sample(
        id="abc",
        system=system,
        user_turns=list(turns),
        source=SourceRef(dataset="d", split=None, row=3, format="turns"),
    )


def _turn(text, reason="stop", reasoning=None):
    return TurnResult(
        content=text,
        reasoning=reasoning,
        finish_reason=reason,
        usage=Usage(prompt_tokens=5, completion_tokens=7),
        latency_s=0.5,
        endpoint="http://e/v1",
        model="m",
    )


def test_each_turn_sees_the_models_own_earlier_answers_with_reasoning():
    seen = []

    def call(messages):
        seen.append(messages)
        return _turn(f"a{len(seen)}", reasoning=f"r{len(seen)}")

    turns = answer_turns(_sample(), GenParams(), [], call, lambda done: None)
    assert [t.content for t in turns] == ["a1", "a2"]
    assert seen[1] == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
    ]


def test_a_retry_resumes_at_the_first_unanswered_turn():
    calls = []
    turns = answer_turns(
        _sample(),
        GenParams(),
        [_turn("a1")],
        lambda m: calls.append(m) or _turn("a2"),
        lambda done: None,
    )
    assert len(calls) == 1 and calls[0][-1] == {"role": "user", "content": "q2"}
    assert [t.content for t in turns] == ["a1", "a2"]


def test_progress_is_saved_after_every_turn_but_the_last():
    saved = []
    answer_turns(_sample(("a", "b", "c")), GenParams(), [], lambda m: _turn("x"), saved.append)
    assert [len(s) for s in saved] == [1, 2]


def test_turns_first_answers_only_the_first_user_turn():
    turns = answer_turns(
        _sample(), GenParams(turns="first"), [], lambda m: _turn("x"), lambda d: None
    )
    assert len(turns) == 1


def test_a_turn_cut_by_max_tokens_ends_the_conversation():
    turns = answer_turns(
        _sample(), GenParams(), [], lambda m: _turn("x", reason="length"), lambda d: None
    )
    assert len(turns) == 1 and turns[0].finish_reason == "length"


def test_the_run_system_prompt_replaces_the_sources():
    messages = history(_sample(system="source"), GenParams(system="run"), [])
    assert messages[0] == {"role": "system", "content": "run"}


def test_records_carry_conversation_source_and_generation_details():
    params = GenParams(max_tokens=99)
    record = build_record(
        "r1", _sample(system="s"), params, [_turn("a1", reasoning="t"), _turn("a2")], attempts=2
    )
    data = record.model_dump(by_alias=True, exclude_none=True)
    assert data["schema"] == 1 and data["id"] == "abc" and data["run"] == "r1"
    assert [m["role"] for m in data["conversations"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert data["conversations"][2]["reasoning_content"] == "t"
    assert "reasoning_content" not in data["conversations"][4]
    assert data["source"] == {"dataset": "d", "row": 3, "format": "turns"}
    gen = data["generation"]
    assert gen["usage"] == {"prompt_tokens": 10, "completion_tokens": 14}
    assert gen["attempts"] == 2 and gen["params"]["max_tokens"] == 99
    assert gen["finish_reason"] == "stop" and len(gen["turns"]) == 2
