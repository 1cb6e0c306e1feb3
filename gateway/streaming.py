"""Server-sent events: framing, the OpenAI terminator, and the streaming HTTP response.

OpenAI streams are `data: <json>\\n\\n` frames ending with `data: [DONE]`; Anthropic streams name
each frame (`event: <type>\\ndata: <json>\\n\\n`) and end with the message_stop event. Payloads are
encoded by msgspec once per frame; a frame is one `bytes` so the server writes it in one call.

The body iterator runs inside Litestar's Stream response, which cancels it when the client
disconnects: cancellation surfaces in the iterator at its current await (usually the engine
stream), whose `aclosing` then aborts the engine request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

_encoder = msgspec.json.Encoder()

DONE_FRAME = b"data: [DONE]\n\n"

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    # Reverse proxies (nginx) must not buffer an event stream.
    "X-Accel-Buffering": "no",
}


def data_frame(payload: msgspec.Struct) -> bytes:
    """`data: {...}` followed by the blank line that ends an event."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def raw_data_frame(payload_json: bytes) -> bytes:
    return b"data: " + payload_json + b"\n\n"


def event_frame(event: str, payload: msgspec.Struct) -> bytes:
    """A named event (the Anthropic style): `event: <name>` then the data line."""
    return b"event: " + event.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


def raw_event_frame(event: str, payload_json: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + payload_json + b"\n\n"


def sse_response(frames: AsyncIterator[bytes], on_close: Callable[[], None] | None = None) -> Stream:
    """A text/event-stream response over an iterator of ready-made frames.

    on_close runs after the response, however it ended: the iterator's own cleanup does not run
    if it never started (a client gone before the first byte), this does.
    """
    background = BackgroundTask(on_close) if on_close is not None else None
    return Stream(frames, media_type="text/event-stream", headers=SSE_HEADERS, background=background)
