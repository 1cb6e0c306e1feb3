"""POST /v1/chat/completions: request, response and stream-chunk Structs.

Requests follow the OpenAI API reference (plus the vLLM extensions agent stacks send: top_k,
min_p, repetition_penalty, min_tokens, ignore_eos, stop_token_ids, priority, cache_salt,
chat_template_kwargs). Unknown fields are ignored. Responses and chunks reproduce the OpenAI
shapes exactly, including the nulls clients test for (finish_reason, logprobs, usage).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from gateway.schemas.openai_common import StreamOptions, Usage

# ---- request -------------------------------------------------------------------------------


class TextPart(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ImageURL(msgspec.Struct):
    url: str
    detail: str | None = None


class ImagePart(msgspec.Struct, tag="image_url", tag_field="type"):
    image_url: ImageURL


class InputAudioPart(msgspec.Struct, tag="input_audio", tag_field="type"):
    input_audio: dict[str, Any]


class FilePart(msgspec.Struct, tag="file", tag_field="type"):
    file: dict[str, Any]


class RefusalPart(msgspec.Struct, tag="refusal", tag_field="type"):
    refusal: str


ContentPart = TextPart | ImagePart | InputAudioPart | FilePart | RefusalPart


class FunctionCallIn(msgspec.Struct):
    name: str
    arguments: str = "{}"


class ToolCallIn(msgspec.Struct):
    """A tool call in the conversation history (an earlier assistant turn)."""

    function: FunctionCallIn
    id: str | None = None
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


class ResponseFormat(msgspec.Struct):
    type: str
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(msgspec.Struct):
    messages: list[ChatMessage]
    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a JSON key) -> bias
    logprobs: bool = False
    top_logprobs: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    # vLLM-compatible extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0
    cache_salt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ---- response ------------------------------------------------------------------------------


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class ResponseMessage(msgspec.Struct):
    content: str | None
    role: str = "assistant"
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None


# ---- stream chunks -------------------------------------------------------------------------


class FunctionCallDelta(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    """One step of a streamed tool call: id, type and name only in the call's first delta."""

    index: int
    function: FunctionCallDelta
    id: str | None = None
    type: str | None = None


class ChoiceDelta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None


class ChatCompletionChunkWithUsage(msgspec.Struct):
    """The chunk shape when stream_options.include_usage is set: usage is null on every chunk
    but the last one, whose choices are empty."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None


request_decoder = msgspec.json.Decoder(ChatCompletionRequest)
