"""POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API).

Content blocks are tagged unions on "type"; unknown request fields are ignored. Stream events
follow the documented order: message_start, then per block content_block_start / *_delta /
content_block_stop, then message_delta and message_stop.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# ---- request -------------------------------------------------------------------------------


class TextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str
    cache_control: dict[str, Any] | None = None


class ImageBlock(msgspec.Struct, tag="image", tag_field="type"):
    source: dict[str, Any]


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type"):
    source: dict[str, Any]


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str


ContentBlock = (
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class Message(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ToolDefinition(msgspec.Struct):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    type: str | None = None  # "custom" or absent for client tools


class ToolChoiceAuto(msgspec.Struct, tag="auto", tag_field="type"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(msgspec.Struct, tag="any", tag_field="type"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(msgspec.Struct, tag="tool", tag_field="type"):
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(msgspec.Struct, tag="none", tag_field="type"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class MessagesRequest(msgspec.Struct):
    model: str
    max_tokens: int
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(msgspec.Struct):
    model: str
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None


# ---- response ------------------------------------------------------------------------------


class TextContent(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ToolUseContent(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(msgspec.Struct, tag="message", tag_field="type"):
    id: str
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    role: str = "assistant"


class CountTokensResponse(msgspec.Struct):
    input_tokens: int


# ---- stream events -------------------------------------------------------------------------


class MessageStart(msgspec.Struct, tag="message_start", tag_field="type"):
    message: MessageResponse


class Ping(msgspec.Struct, tag="ping", tag_field="type"):
    pass


class ContentBlockStart(msgspec.Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: TextContent | ToolUseContent


class TextDelta(msgspec.Struct, tag="text_delta", tag_field="type"):
    text: str


class InputJsonDelta(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class ContentBlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | InputJsonDelta


class ContentBlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type"):
    index: int


class MessageDeltaBody(msgspec.Struct):
    stop_reason: str | None
    stop_sequence: str | None


class MessageDeltaUsage(msgspec.Struct):
    output_tokens: int


class MessageDelta(msgspec.Struct, tag="message_delta", tag_field="type"):
    delta: MessageDeltaBody
    usage: MessageDeltaUsage


class MessageStop(msgspec.Struct, tag="message_stop", tag_field="type"):
    pass


StreamEvent = (
    MessageStart | Ping | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop
)

request_decoder = msgspec.json.Decoder(MessagesRequest)
count_tokens_decoder = msgspec.json.Decoder(CountTokensRequest)
