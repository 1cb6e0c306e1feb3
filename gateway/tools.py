"""Tool-call parsing for the Hermes/Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

`ToolCallParser` is incremental: feed it text deltas as the engine produces them and it returns
what can be shown now, content text and tool-call deltas. The non-streamed path feeds the whole
text once, so both paths produce the same content and the same arguments strings.

Streaming contract (what OpenAI clients accumulate):
- a tool call's first delta carries its index, id and name (arguments ""), and comes only once the
  name is known; later deltas carry argument text only; concatenating them gives the arguments;
- arguments given as a JSON object are streamed as the model writes them, character for
  character; given as a JSON string they are sent, decoded, when the string ends;
- text outside the tags is content; whitespace around tool calls is dropped; a `<tool_call>`
  whose body is not a JSON object falls back to content, since nothing of it was sent yet.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_ARGUMENT_KEYS = ("arguments", "parameters")
_WHITESPACE = " \t\r\n"


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCallDelta:
    index: int
    arguments: str
    id: str | None = None  # set on the call's first delta only, with name
    name: str | None = None


@dataclass
class ParsedDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str


class _JsonCallScanner:
    """Scans one tool call's JSON object character by character.

    Tracks strings, escapes and nesting to find the object's top-level keys, the `name` value and
    the raw text of the arguments value, without waiting for the object to close.
    """

    def __init__(self) -> None:
        self.raw = ""
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.slot = "key?"  # key? key colon? value? value-str value-container value-scalar comma?
        self.token_start = 0
        self.key: str | None = None
        self.name: str | None = None
        self.arguments_start: int | None = None
        self.arguments_end: int | None = None
        self.arguments_kind = ""  # "container", "str" or "scalar"
        self.complete = False
        self.failed = False

    def feed(self, text: str) -> int:
        """Consumes text up to the end of the object; returns how many characters were used."""
        for offset, char in enumerate(text):
            self._step(char)
            if self.complete or self.failed:
                return offset + 1
        return len(text)

    def _step(self, char: str) -> None:
        position = len(self.raw)
        self.raw += char
        if self.in_string:
            if self.escape:
                self.escape = False
            elif char == "\\":
                self.escape = True
            elif char == '"':
                self.in_string = False
                if self.depth == 1 and self.slot == "key":
                    self.key = _loads_or_none(self.raw[self.token_start:])
                    self.slot = "colon?"
                elif self.depth == 1 and self.slot == "value-str":
                    self._end_value(position + 1)
            return
        if self.depth == 0:
            if char == "{":
                self.depth = 1
            elif char not in _WHITESPACE:
                self.failed = True
            return
        if char == '"':
            self.in_string = True
            if self.depth == 1 and self.slot == "key?":
                self.slot, self.token_start = "key", position
            elif self.depth == 1 and self.slot == "value?":
                self._start_value("value-str", position)
        elif char in "{[":
            if self.depth == 1 and self.slot == "value?":
                self._start_value("value-container", position)
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            if self.depth == 1 and self.slot == "value-container":
                self._end_value(position + 1)
            elif self.depth == 0:
                if self.slot == "value-scalar":
                    self._end_value(position)
                self.complete = True
        elif self.depth == 1:
            if char == ":" and self.slot == "colon?":
                self.slot = "value?"
            elif char == ",":
                if self.slot == "value-scalar":
                    self._end_value(position)
                self.slot = "key?"
            elif char not in _WHITESPACE and self.slot == "value?":
                self._start_value("value-scalar", position)

    def _start_value(self, slot: str, position: int) -> None:
        self.slot, self.token_start = slot, position
        if self.key in _ARGUMENT_KEYS and self.arguments_start is None:
            self.arguments_start = position
            self.arguments_kind = slot.removeprefix("value-")

    def _end_value(self, end: int) -> None:
        if self.key == "name" and self.name is None:
            value = _loads_or_none(self.raw[self.token_start:end])
            self.name = value if isinstance(value, str) else None
        if self.arguments_start == self.token_start and self.arguments_end is None:
            self.arguments_end = end
        self.slot = "comma?"

    def arguments_text(self) -> str | None:
        """The arguments as known so far (None until the value has begun)."""
        if self.arguments_start is None:
            return None
        if self.arguments_kind == "container":
            end = self.arguments_end if self.arguments_end is not None else len(self.raw)
            return self.raw[self.arguments_start:end]
        if self.arguments_end is None:
            return None  # strings and scalars are sent whole
        raw = self.raw[self.arguments_start:self.arguments_end].strip()
        if self.arguments_kind == "str":
            value = _loads_or_none(raw)
            return value if isinstance(value, str) else raw
        return raw


def _loads_or_none(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


class ToolCallParser:
    """Splits model output into content and tool calls; see the module docstring."""

    def __init__(self, id_factory: Callable[[], str] = new_tool_call_id) -> None:
        self._id_factory = id_factory
        self._pending = ""  # unconsumed text (a possible tag prefix, or held whitespace)
        self._state = "text"  # "text", "body" (inside a tool call) or "after" (JSON done, before the end tag)
        self._scanner: _JsonCallScanner | None = None
        self._call_index: int | None = None  # the current call's index once its name was announced
        self._sent_arguments = 0  # characters of the current call's arguments already sent
        self._after_call = False  # drop whitespace that follows a tool call
        self._layout = ""  # whitespace dropped before the current call
        self.tool_calls: list[ParsedToolCall] = []

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.tool_calls)

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._pending += text
        self._drain(out, final=False)
        return out

    def finish(self) -> ParsedDelta:
        """Flushes what was held back at the end of the output (a cut-off call stays as it is)."""
        out = ParsedDelta()
        self._drain(out, final=True)
        if self._state == "body" and self._scanner is not None and self._call_index is None:
            # Never became a call: what the model wrote is content after all.
            out.content += self._layout + TOOL_CALL_START + self._scanner.raw + self._pending
        elif self._state == "text":
            out.content += self._pending.strip(_WHITESPACE) if self._after_call else self._pending
        self._pending = ""
        return out

    # ---- internals ---------------------------------------------------------------------------
    def _drain(self, out: ParsedDelta, final: bool) -> None:
        while self._pending:
            before = (self._state, len(self._pending))
            if self._state == "text":
                self._drain_text(out)
            elif self._state == "body":
                self._drain_body(out)
            else:
                self._drain_after(final)
            if (self._state, len(self._pending)) == before:
                return  # waiting for more text

    def _drain_text(self, out: ParsedDelta) -> None:
        pending = self._pending
        start = pending.find(TOOL_CALL_START)
        if start >= 0:
            # Whitespace before a call (and after the previous one) is layout, not content; it is
            # kept aside in case the "call" turns out not to be one.
            before = pending[:start]
            text = before.rstrip(_WHITESPACE)
            self._layout = before[len(text):]
            self._emit_content(out, text.lstrip(_WHITESPACE) if self._after_call else text)
            self._pending = pending[start + len(TOOL_CALL_START):]
            self._state, self._scanner, self._call_index, self._sent_arguments = "body", _JsonCallScanner(), None, 0
            return
        # Hold back a possible start of the tag and trailing whitespace (it may precede a call).
        keep = _partial_suffix(pending, TOOL_CALL_START)
        body = pending[: len(pending) - keep]
        text = body.rstrip(_WHITESPACE)
        self._pending = pending[len(text):]
        if self._after_call:
            text = text.lstrip(_WHITESPACE)
        self._emit_content(out, text)

    def _drain_body(self, out: ParsedDelta) -> None:
        scanner = self._scanner
        assert scanner is not None
        used = scanner.feed(self._pending)
        self._pending = self._pending[used:]
        if scanner.failed:
            # Not JSON: the tag and its text are content (nothing of this call was sent).
            self._state = "text"
            self._emit_content(out, self._layout + TOOL_CALL_START + scanner.raw)
            return
        self._emit_call_progress(out)
        if scanner.complete:
            if self._call_index is None:
                # A JSON object without a name is not a call either.
                self._state = "text"
                self._emit_content(out, self._layout + TOOL_CALL_START + scanner.raw)
            else:
                self._state = "after"

    def _drain_after(self, final: bool) -> None:
        pending = self._pending.lstrip(_WHITESPACE)
        if pending.startswith(TOOL_CALL_END):
            pending = pending[len(TOOL_CALL_END):]
            self._state, self._after_call = "text", True
        elif pending.startswith(TOOL_CALL_START):
            self._state, self._after_call = "text", True
        elif pending and not final and (TOOL_CALL_END.startswith(pending) or TOOL_CALL_START.startswith(pending)):
            pass  # a tag may be arriving
        elif pending:
            pending = pending[1:]  # stray text between the JSON and the end tag
        self._pending = pending

    def _emit_call_progress(self, out: ParsedDelta) -> None:
        scanner = self._scanner
        assert scanner is not None
        if scanner.name is None:
            return
        if self._call_index is None:
            call_id = self._id_factory()
            self._call_index = len(self.tool_calls)
            self.tool_calls.append(ParsedToolCall(call_id, scanner.name, ""))
            out.tool_calls.append(ToolCallDelta(self._call_index, "", id=call_id, name=scanner.name))
        arguments = scanner.arguments_text()
        if scanner.complete and arguments is None:
            arguments = "{}"  # a call without arguments
        new_text = (arguments or "")[self._sent_arguments:]
        if not new_text:
            return
        self._sent_arguments += len(new_text)
        self.tool_calls[self._call_index].arguments += new_text
        if out.tool_calls and out.tool_calls[-1].index == self._call_index:
            out.tool_calls[-1].arguments += new_text
        else:
            out.tool_calls.append(ToolCallDelta(self._call_index, new_text))

    def _emit_content(self, out: ParsedDelta, text: str) -> None:
        if text:
            out.content += text
            self._after_call = False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
