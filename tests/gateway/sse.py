"""A strict server-sent-events reader for wire-format tests (no SDK smoothing anything over)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(body: bytes) -> list[Event]:
    """Splits a complete event-stream body into events; every event must end with a blank line."""
    text = body.decode("utf-8")
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text.split("\n\n")[:-1]:
        name, data_lines = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data_lines.append(value)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        events.append(Event(name, "\n".join(data_lines)))
    return events
