"""Putting tools into the prompt, for templates that know tools and for those that do not.

A chat template that reads the `tools` variable (Qwen2.5/3, Llama 3.1, Hermes) gets the tools and
the tool-call history as structured data and renders them its own way. A template without tool
support (SmolLM2's plain ChatML) gets the Hermes/Qwen convention written into the messages
themselves: the tool signatures in the system message, earlier calls as `<tool_call>` JSON in the
assistant turns, and tool results as `<tool_response>` blocks in user turns. Either way the model
answers in the format gateway/tools.py parses.

`tool_choice` "required" or a named function is enforced by starting the assistant's answer
(a prefill) with the opening of a call: the model can then only continue the call. Without
constrained decoding this is the strongest nudge available; the parser still checks the result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.tools import TOOL_CALL_END, TOOL_CALL_START

_TOOLS_INTRO = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
)


@dataclass(frozen=True)
class ToolChoice:
    """How the model may use tools: mode "none", "auto", "required" or "function" (with name)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def uses_tools(self) -> bool:
        return self.mode != "none"


def template_supports_tools(template: str | None) -> bool:
    """Whether a chat template renders the `tools` variable itself."""
    return template is not None and "tools" in template


def tools_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The Hermes/Qwen tool block: one JSON signature per line inside <tools></tools>."""
    lines = [json.dumps(tool, ensure_ascii=False) for tool in tools]
    return _TOOLS_INTRO + "\n" + "\n".join(lines) + "\n" + _TOOLS_OUTRO


def tool_call_text(name: str, arguments: Any) -> str:
    """One earlier call, as the model is asked to write it."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_START}\n{call}\n{TOOL_CALL_END}"


def prefill_for(choice: ToolChoice) -> str:
    """The start of the assistant's answer that forces a call (empty when the model may choose)."""
    if choice.mode == "required":
        return f'{TOOL_CALL_START}\n{{"name": "'
    if choice.mode == "function":
        return f'{TOOL_CALL_START}\n{{"name": {json.dumps(choice.name, ensure_ascii=False)}, "arguments": '
    return ""


def parse_arguments(arguments: str) -> Any:
    """A call's arguments string as the object templates expect (the string itself if not JSON)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def structured_tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For templates with tool support: arguments as objects, as their authors render them."""
    result: list[dict[str, Any]] = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": parse_arguments(call["function"]["arguments"])}}
                for call in message["tool_calls"]
            ]
        result.append(message)
    return result


def inline_tool_messages(messages: Sequence[Mapping[str, Any]],
                         tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """For templates without tool support: tools, calls and results written as plain text.

    The tool block joins the system message (one is added when the conversation has none);
    consecutive tool results are merged into one user turn, as Qwen's template does.
    """
    result: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            parts = [message["content"]] if message.get("content") else []
            parts += [tool_call_text(call["function"]["name"], parse_arguments(call["function"]["arguments"]))
                      for call in message["tool_calls"]]
            result.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            previous = result[-1] if result else None
            if previous is not None and previous.get("_tool_results"):
                previous["content"] += "\n" + block
            else:
                result.append({"role": "user", "content": block, "_tool_results": True})
        else:
            result.append(dict(message))
    for message in result:
        message.pop("_tool_results", None)
    if tools:
        block = tools_system_prompt(tools)
        if result and result[0]["role"] == "system":
            system = result[0].get("content") or ""
            result[0] = {**result[0], "content": f"{system}\n\n{block}" if system else block}
        else:
            result.insert(0, {"role": "system", "content": block})
    return result
