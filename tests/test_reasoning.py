from types import SimpleNamespace

from worker.chat.reasoning import delta_reasoning, finish_text, split_inline_think


def test_reasoning_is_read_from_the_current_vllm_field():
    assert delta_reasoning(SimpleNamespace(reasoning="r", content=None)) == "r"


def test_reasoning_is_read_from_the_older_reasoning_content_field():
    assert delta_reasoning(SimpleNamespace(reasoning_content="r")) == "r"
    assert delta_reasoning({"reasoning_content": "r"}) == "r"


def test_a_delta_without_reasoning_gives_none():
    assert delta_reasoning(SimpleNamespace(content="x")) is None


def test_inline_think_blocks_are_split_from_the_answer():
    assert split_inline_think("<think>\nhmm\n</think>\n\nAnswer") == ("hmm", "Answer")


def test_a_closing_tag_alone_means_the_template_opened_the_block():
    assert split_inline_think("hmm</think>Answer") == ("hmm", "Answer")


def test_content_without_think_tags_is_left_alone():
    assert split_inline_think("just text") == (None, "just text")


def test_text_before_an_opening_tag_is_not_taken_for_reasoning():
    text = "Use <think> tags like <think>x</think> here"
    assert split_inline_think(text) == (None, text)


def test_streamed_reasoning_wins_over_inline_parsing():
    assert finish_text("answer", "thought") == ("thought", "answer")
    assert finish_text("<think>t</think>a", None) == ("t", "a")
