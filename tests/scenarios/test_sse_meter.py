"""The stream measurement of the load scenarios: what counts as the first token, gaps, usage."""

from __future__ import annotations

import json

import pytest

from scenarios.locust.sse_meter import SSEMeter


def _frame(payload: dict | str) -> bytes:
    body = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {body}\n\n".encode()


def _chat_delta(**delta) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def test_ttft_is_at_the_first_output_frame_not_the_role_frame() -> None:
    meter = SSEMeter(started_at=10.0)
    meter.feed(_frame(_chat_delta(role="assistant", content="")), now=10.1)
    meter.feed(_frame(_chat_delta(content="Hel")), now=10.5)
    meter.feed(_frame(_chat_delta(content="lo")), now=10.7)
    meter.feed(_frame(_chat_delta(content="!")), now=11.0)
    meter.feed(_frame({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3,
                                                "prompt_tokens_details": {"cached_tokens": 32}}}), now=11.0)
    meter.feed(_frame("[DONE]"), now=11.0)
    result = meter.close(now=11.0)
    assert result.ttft == pytest.approx(0.5)
    assert result.chunk_gaps == pytest.approx([0.2, 0.3])
    assert result.text == "Hello!" and result.done and result.error is None
    assert (result.output_tokens, result.prompt_tokens, result.cached_tokens) == (3, 40, 32)
    assert result.time_per_output_token == pytest.approx(0.25)  # (11.0 - 10.5) / (3 - 1)


def test_frames_split_anywhere_and_crlf_are_reassembled() -> None:
    body = (_frame({"choices": [{"index": 0, "text": "def", "finish_reason": None}]})
            + _frame({"choices": [{"index": 0, "text": " f", "finish_reason": "length"}]}) + _frame("[DONE]"))
    body = body.replace(b"\n", b"\r\n")
    meter = SSEMeter(started_at=0.0)
    for offset in range(0, len(body), 7):  # pieces that cut lines and even the CRLF pairs
        meter.feed(body[offset:offset + 7], now=float(offset))
    result = meter.close(now=999.0)
    assert result.text == "def f" and result.done and result.finish_reason == "length"
    assert len(result.output_times) == 2
    # Without usage, each output frame counts one token.
    assert result.output_tokens == 2


def test_tool_call_deltas_are_output_and_are_assembled() -> None:
    meter = SSEMeter(started_at=0.0)
    meter.feed(_frame(_chat_delta(role="assistant")), now=0.1)
    meter.feed(_frame(_chat_delta(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                               "function": {"name": "read_file", "arguments": ""}}])), now=0.4)
    meter.feed(_frame(_chat_delta(tool_calls=[{"index": 0, "function": {"arguments": '{"path": '}}])), now=0.5)
    meter.feed(_frame(_chat_delta(tool_calls=[{"index": 0, "function": {"arguments": '"a.py"}'}}])), now=0.6)
    result = meter.close(now=0.6)
    assert result.ttft == pytest.approx(0.4)
    assert result.calls() == [("call_1", "read_file", '{"path": "a.py"}')]
    assert not result.done  # no [DONE] seen: the caller decides whether that is an error


def test_error_frames_and_garbage_are_errors() -> None:
    meter = SSEMeter(started_at=0.0)
    meter.feed(_frame({"error": {"message": "engine stopped", "type": "server_error"}}), now=1.0)
    assert meter.close(now=1.0).error == "error frame: engine stopped"
    meter = SSEMeter(started_at=0.0)
    meter.feed(b"data: {not json\n\n", now=1.0)
    assert meter.close(now=1.0).error.startswith("frame is not JSON")


def test_llama_cpp_timings_give_cached_tokens_when_usage_has_none() -> None:
    meter = SSEMeter(started_at=0.0)
    meter.feed(_frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "timings": {"cache_n": 120, "prompt_n": 30}}), now=1.0)
    result = meter.close(now=1.0)
    assert (result.cached_tokens, result.prompt_tokens) == (120, 150)


def test_comments_and_other_fields_are_ignored_and_a_last_unterminated_line_counts() -> None:
    meter = SSEMeter(started_at=0.0)
    meter.feed(b": keep-alive\nevent: message\nid: 3\n\n", now=0.5)
    meter.feed(b'data: {"choices": [{"index": 0, "text": "x"}]}', now=0.75)  # no newline yet
    assert meter.measurement.output_times == []
    result = meter.close(now=0.9)
    assert result.output_times == [0.9] and result.text == "x"
