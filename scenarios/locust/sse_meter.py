"""Measures one streamed OpenAI response (Server-Sent Events) as it arrives.

Locust's own response time ends when the headers arrive, long before a stream's body, so the
numbers that matter for serving are taken here, from the bytes, as they come:

- time to first token (TTFT): at the first frame that carries generated output (non-empty
  `delta.content`, `text`, `reasoning_content` or a tool-call delta), not at the opening frame
  that only names the role;
- chunk gaps: the time between consecutive output-carrying frames (what vLLM's benchmarks call
  inter-token latency; with speculative decoding one frame may carry several tokens);
- output tokens: `usage.completion_tokens` of the final frame (stream_options.include_usage),
  else the number of output frames (one token per frame without speculation);
- prompt and cached prompt tokens: `usage.prompt_tokens_details.cached_tokens` (OpenAI,
  draftgate), else llama.cpp's `timings.cache_n`.

Server-neutral and free of Locust, so the same code measures every system and is unit-tested.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


@dataclass
class StreamMeasurement:
    """What one stream delivered, with arrival times in seconds of one monotonic clock."""

    started_at: float
    output_times: list[float] = field(default_factory=list)  # arrival of each output-carrying frame
    text: str = ""
    tool_calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False  # saw `data: [DONE]`
    error: str | None = None  # an error frame, or bytes that were not SSE JSON

    @property
    def ttft(self) -> float | None:
        return self.output_times[0] - self.started_at if self.output_times else None

    @property
    def chunk_gaps(self) -> list[float]:
        times = self.output_times
        return [later - earlier for earlier, later in zip(times, times[1:])]

    @property
    def output_tokens(self) -> int:
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return len(self.output_times)

    @property
    def time_per_output_token(self) -> float | None:
        """Decode time per token after the first: (last frame - first frame) / (tokens - 1)."""
        if len(self.output_times) < 2 or self.output_tokens < 2:
            return None
        return (self.output_times[-1] - self.output_times[0]) / (self.output_tokens - 1)

    def calls(self) -> list[tuple[str, str, str]]:
        """Streamed tool calls as (id, name, arguments text), in index order."""
        return [(entry[0], entry[1], entry[2]) for _, entry in sorted(self.tool_calls.items())]


class SSEMeter:
    """Feed it the response body in whatever pieces the socket gives; it keeps the measurement.

    Frames are split on line ends (the SSE grammar allows CRLF, LF or CR); only `data:` lines
    matter to OpenAI streams. A frame is timed when the piece that completes its line arrives.
    """

    def __init__(self, started_at: float) -> None:
        self.measurement = StreamMeasurement(started_at=started_at)
        self._buffer = b""

    def feed(self, piece: bytes | str, now: float) -> None:
        if isinstance(piece, str):
            piece = piece.encode()
        self._buffer += piece
        # CR alone also ends a line in SSE; normalise before splitting.
        normalised = self._buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, self._buffer = normalised.split(b"\n")
        for line in lines:
            self._line(line.decode("utf-8", errors="replace"), now)

    def close(self, now: float) -> StreamMeasurement:
        """End of the body: a last line without its newline still counts."""
        if self._buffer:
            self._line(self._buffer.decode("utf-8", errors="replace"), now)
            self._buffer = b""
        return self.measurement

    def _line(self, line: str, now: float) -> None:
        if not line.startswith("data:"):
            return  # comments (":"), event:, id:, retry: and the blank frame separators
        payload = line[5:].strip()
        if payload == DONE:
            self.measurement.done = True
            return
        try:
            frame = json.loads(payload)
        except ValueError:
            self.measurement.error = self.measurement.error or f"frame is not JSON: {payload[:200]!r}"
            return
        if isinstance(frame, dict):
            self._frame(frame, now)

    def _frame(self, frame: dict[str, Any], now: float) -> None:
        measurement = self.measurement
        if "error" in frame:
            error = frame["error"]
            message = error.get("message") if isinstance(error, dict) else error
            measurement.error = measurement.error or f"error frame: {message}"
            return
        carried_output = False
        for choice in frame.get("choices") or ():
            carried_output |= self._choice(choice)
        if carried_output:
            measurement.output_times.append(now)
        usage = frame.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        timings = frame.get("timings")
        if isinstance(timings, dict) and measurement.cached_tokens is None and "cache_n" in timings:
            # llama.cpp: prompt tokens taken from its slot's cache, beside the OpenAI usage.
            measurement.cached_tokens = int(timings["cache_n"])
            if measurement.prompt_tokens is None and "prompt_n" in timings:
                measurement.prompt_tokens = int(timings["prompt_n"]) + int(timings["cache_n"])

    def _choice(self, choice: dict[str, Any]) -> bool:
        measurement = self.measurement
        if choice.get("finish_reason"):
            measurement.finish_reason = choice["finish_reason"]
        carried = False
        delta = choice.get("delta") or {}
        for piece in (choice.get("text"), delta.get("content")):  # completions, chat
            if isinstance(piece, str) and piece:
                measurement.text += piece
                carried = True
        reasoning = delta.get("reasoning_content")
        carried |= isinstance(reasoning, str) and bool(reasoning)
        for call in delta.get("tool_calls") or ():
            entry = measurement.tool_calls.setdefault(int(call.get("index", 0)), ["", "", ""])
            function = call.get("function") or {}
            entry[0] = call.get("id") or entry[0]
            entry[1] = function.get("name") or entry[1]
            entry[2] += function.get("arguments") or ""
            carried |= bool(function.get("name") or function.get("arguments"))
        return carried

    def _usage(self, usage: dict[str, Any]) -> None:
        measurement = self.measurement
        if isinstance(usage.get("completion_tokens"), int):
            measurement.usage_completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            measurement.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            measurement.cached_tokens = details["cached_tokens"]
