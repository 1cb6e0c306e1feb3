"""The Hermes/Qwen tool-call parser, streamed in any chunking and at once, on recorded model outputs."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tool_prompt import ToolChoice, prefill_for
from gateway.tools import ParsedToolCall, ToolCallDelta, ToolCallParser

# Recorded outputs: Qwen2.5-7B-Instruct answering a two-city weather question (parallel calls),
# and the embedded SmolLM2 under a forced get_weather call (what follows the prefill).
QWEN_PARALLEL = (
    'I will look both up.\n\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
    '"San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_temperature_date", '
    '"arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}}\n</tool_call>'
)
SMOLLM_FORCED = '{"type": "object", "properties": {"temperature": {"type": "number", "defaultValue": 10.0}}}}'


def run(chunks: list[str]) -> tuple[str, list[ToolCallDelta], list[ParsedToolCall]]:
    ids = (f"call_{i}" for i in itertools.count())
    parser = ToolCallParser(lambda: next(ids))
    outputs = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    content = "".join(o.content for o in outputs)
    deltas = [d for o in outputs for d in o.tool_calls]
    return content, deltas, parser.tool_calls


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def test_parallel_calls_with_leading_content() -> None:
    content, deltas, calls = run([QWEN_PARALLEL])
    assert content == "I will look both up."
    assert [(c.id, c.name) for c in calls] == [("call_0", "get_current_temperature"),
                                               ("call_1", "get_temperature_date")]
    assert json.loads(calls[0].arguments) == {"location": "San Francisco, CA, USA", "unit": "celsius"}
    assert json.loads(calls[1].arguments) == {"location": "San Francisco, CA, USA", "date": "2024-10-01",
                                              "unit": "celsius"}
    # The arguments are the model's own text, character for character.
    assert calls[0].arguments == '{"location": "San Francisco, CA, USA", "unit": "celsius"}'


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(QWEN_PARALLEL)), max_size=40))
def test_any_chunking_streams_the_same_result(cuts: list[int]) -> None:
    whole_content, _, whole_calls = run([QWEN_PARALLEL])
    content, deltas, calls = run(split(QWEN_PARALLEL, cuts))
    assert content == whole_content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
    # Streaming contract: id and name once per call, first; arguments concatenate to the final ones.
    for index, call in enumerate(calls):
        own = [d for d in deltas if d.index == index]
        assert own[0].id == call.id and own[0].name == call.name
        assert all(d.id is None and d.name is None for d in own[1:])
        assert "".join(d.arguments for d in own) == call.arguments
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)


def test_char_by_char_equals_whole_for_tricky_strings() -> None:
    text = ('<tool_call>{"name": "say", "arguments": {"text": "a } ] \\" </tool_call> {", "n": [1, {"x": null}]}}'
            "</tool_call>")
    whole = run([text])
    by_char = run(list(text))
    assert by_char[0] == whole[0] and by_char[2] == whole[2]
    assert json.loads(whole[2][0].arguments) == {"text": 'a } ] " </tool_call> {', "n": [1, {"x": None}]}


def test_plain_text_passes_through_unchanged() -> None:
    text = "Use <b>bold</b> and a < sign; <tool is not a tag. Trailing space "
    for chunks in ([text], list(text)):
        content, deltas, calls = run(chunks)
        assert content == text and not deltas and not calls


def test_arguments_given_as_a_json_string_are_decoded() -> None:
    _, deltas, calls = run(['<tool_call>{"arguments": "{\\"q\\": 1}", "name": "search"}</tool_call>'])
    assert calls[0].name == "search" and calls[0].arguments == '{"q": 1}'
    assert deltas[0].name == "search"


def test_call_without_arguments_gets_an_empty_object() -> None:
    _, _, calls = run(['<tool_call>{"name": "now"}</tool_call>'])
    assert calls[0].arguments == "{}"


def test_body_that_is_not_json_stays_content() -> None:
    text = "<tool_call>get_weather(city='Paris')</tool_call> done"
    assert run(list(text))[0] == text
    assert run([text])[1:] == ([], [])


def test_object_without_name_stays_content() -> None:
    text = '<tool_call>{"city": "Paris"}</tool_call>'
    content, deltas, calls = run([text])
    assert content == text and not calls


def test_output_cut_inside_the_arguments_keeps_the_partial_call() -> None:
    content, deltas, calls = run(['<tool_call>\n{"name": "f", "arguments": {"a": [1, 2'])
    assert content == "" and calls[0].name == "f" and calls[0].arguments == '{"a": [1, 2'


def test_output_cut_before_the_name_is_content() -> None:
    content, _, calls = run(['Sure. <tool_call>\n{"na'])
    assert calls == [] and content == 'Sure. <tool_call>\n{"na'


def test_stray_text_between_json_and_end_tag_is_dropped() -> None:
    content, _, calls = run(['<tool_call>{"name": "f", "arguments": {}}}\n</tool_call>\nAfter.'])
    assert calls[0].arguments == "{}" and content == "After."


def test_named_prefill_announces_the_call_before_any_model_text() -> None:
    ids = iter(["call_x"])
    parser = ToolCallParser(lambda: next(ids))
    announced = parser.feed(prefill_for(ToolChoice("function", "get_weather")))
    assert announced.tool_calls == [ToolCallDelta(0, "", id="call_x", name="get_weather")]
    body = parser.feed(SMOLLM_FORCED)
    tail = parser.finish()
    assert body.content == tail.content == ""
    arguments = "".join(d.arguments for d in body.tool_calls + tail.tool_calls)
    assert json.loads(arguments) == {"type": "object", "properties": {"temperature": {"type": "number",
                                                                                      "defaultValue": 10.0}}}


def test_required_prefill_lets_the_model_write_the_name() -> None:
    parser = ToolCallParser()
    assert not parser.feed(prefill_for(ToolChoice("required")))
    delta = parser.feed('get_time", "arguments": {"city": "Rome"}}')
    assert delta.tool_calls[0].name == "get_time"
    assert parser.tool_calls[0].arguments == '{"city": "Rome"}'
