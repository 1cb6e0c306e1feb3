"""A conversation (OpenAI-style message dicts), its tools and tool choice -> prompt token ids.

Both chat routes (OpenAI and Anthropic) normalise their messages to the same dicts: role
system/user/assistant/tool, string content, tool_calls with string arguments, tool_call_id. This
module renders them with the model's chat template (tools handled per gateway/tool_prompt.py),
appends the tool-choice prefill, and tokenizes. Large conversations are rendered and tokenized
in a worker thread so the event loop keeps serving other requests meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from engine.model.tokenizer import Tokenizer
from gateway.errors import APIError, unprocessable
from gateway.tool_prompt import (
    ToolChoice,
    inline_tool_messages,
    prefill_for,
    structured_tool_messages,
    template_supports_tools,
)
from gateway.tools import TOOL_CALL_END

# Conversations longer than this (in characters) are tokenized off the event loop.
_OFFLOAD_CHARS = 16_384
# Template variables a client may not set through chat_template_kwargs.
_RESERVED_TEMPLATE_KEYS = frozenset({"messages", "tools", "documents", "add_generation_prompt", "chat_template",
                                     "continue_final_message", "special_tokens"})


@dataclass
class ChatPrompt:
    token_ids: list[int]
    # Text the assistant's answer starts with (forced tool call); the tool parser reads it first.
    prefill: str = ""
    parse_tools: bool = False
    # Stop strings the gateway adds (not the client's): a forced call ends at its end tag.
    extra_stop: list[str] = field(default_factory=list)


def render_chat_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: ToolChoice,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """Renders and tokenizes; a template that refuses the conversation gives 422 naming messages."""
    kwargs = dict(template_kwargs or {})
    for key in kwargs:
        if key in _RESERVED_TEMPLATE_KEYS:
            raise APIError(400, f"chat_template_kwargs may not set {key!r}", param="chat_template_kwargs")
    use_tools = bool(tools) and tool_choice.uses_tools
    try:
        if _renders_tools(tokenizer, use_tools):
            text = tokenizer.apply_chat_template(structured_tool_messages(messages),
                                                 tools=list(tools) if use_tools and tools else None,
                                                 add_generation_prompt=True, **kwargs)
        else:
            text = tokenizer.apply_chat_template(inline_tool_messages(messages, tools if use_tools else None),
                                                 add_generation_prompt=True, **kwargs)
    except ValueError as error:
        raise unprocessable(str(error), param="messages") from None
    prefill = prefill_for(tool_choice) if use_tools else ""
    token_ids = tokenizer.encode(text + prefill, add_special_tokens=False)
    forced = use_tools and tool_choice.mode in ("required", "function")
    return ChatPrompt(token_ids, prefill=prefill, parse_tools=use_tools, extra_stop=[TOOL_CALL_END] if forced else [])


async def render_chat_prompt_async(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: ToolChoice,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    size = sum(len(m.get("content") or "") for m in messages if isinstance(m.get("content"), str))
    if size < _OFFLOAD_CHARS:
        return render_chat_prompt(tokenizer, messages, tools, tool_choice, template_kwargs)
    return await anyio.to_thread.run_sync(render_chat_prompt, tokenizer, messages, tools, tool_choice, template_kwargs)


def _renders_tools(tokenizer: Tokenizer, use_tools: bool) -> bool:
    templates: Mapping[str, str] = getattr(tokenizer, "chat_templates", {}) or {}
    if use_tools and "tool_use" in templates:
        return True
    return template_supports_tools(tokenizer.chat_template)


def resolve_tool_choice(choice: str | None, name: str | None, tool_names: Sequence[str], param: str) -> ToolChoice:
    """Validates a tool choice against the request's tools (400 naming `param` when it cannot hold)."""
    if choice is None:
        return ToolChoice("auto" if tool_names else "none")
    if choice in ("required", "function") and not tool_names:
        raise APIError(400, f"{param} {choice!r} needs at least one tool in 'tools'", param=param)
    if choice == "required" and len(tool_names) == 1:
        # One tool to call: the same as naming it, and the prefill can then fix the name too.
        return ToolChoice("function", tool_names[0])
    if choice == "function":
        if name not in tool_names:
            raise APIError(400, f"{param} names function {name!r}, which is not among the tools "
                           f"({', '.join(tool_names)})", param=param)
        return ToolChoice("function", name)
    return ToolChoice(choice)
