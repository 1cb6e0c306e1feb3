"""Chat templates: render a conversation to the prompt text the model was trained on.

Templates are jinja2 programs shipped with the model (tokenizer_config.json, chat_template.jinja,
or the GGUF key tokenizer.chat_template). They are rendered the way Hugging Face transformers
renders them, because that is what model authors test against: a sandboxed immutable environment
with trim_blocks and lstrip_blocks, loop controls, and the helpers `raise_exception`,
`strftime_now`, a `tojson` filter that does not escape HTML or non-ASCII, and a `{% generation %}`
block tag (used by some templates to mark assistant spans; it renders its body unchanged here).

Templates come from model files, so they are untrusted code: the sandbox refuses attribute access
to Python internals and mutation of the inputs, and every template failure (syntax, sandbox
violation, `raise_exception`, undefined access) becomes a ValueError carrying the template's own
message, which the gateway can show to the client.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

# A suffix appended to the final message when continuing it, found again in the rendered text and
# cut there, so the prompt ends exactly where the message's content ends (no end-of-turn marker).
# Plain printable text, so that filters such as tojson keep it verbatim.
_CONTINUE_MARKER = "<|draftgate-continue-final-message|>"


class TemplateRaisedError(jinja2.TemplateError):
    """A template called raise_exception(message): the conversation is invalid for this model."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body; we do not track assistant masks."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore attributes, so a template cannot reach dunders through it."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"chat templates may not set underscore attribute {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise TemplateRaisedError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's own tojson HTML-escapes '<', '>', '&' and "'"; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compiles a template once per distinct text (several models or tokenizers may share one)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from None


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    special_tokens: Mapping[str, str | None] | None = None,
    **kwargs: Any,
) -> str:
    """Renders `messages` (OpenAI-style dicts with role/content/...) with the template.

    Keys whose value is None are dropped from each message first (clients send `content: null` or
    `tool_calls: null`, which templates render as "None" or trip over, while they handle a missing
    key). `special_tokens` (bos_token, eos_token, ...) and `kwargs` (e.g. enable_thinking) become
    template variables; kwargs win on a name clash. With `continue_final_message`, the prompt ends
    inside the last message (an assistant prefill) instead of after it; it excludes
    add_generation_prompt. Any template failure raises ValueError with the template's message.
    """
    if not messages:
        raise ValueError("messages must contain at least one message")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be set")
    chat: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be an object, got {type(message).__name__}")
        chat.append({key: value for key, value in message.items() if value is not None})
    variables: dict[str, Any] = {name: value for name, value in (special_tokens or {}).items() if value is not None}
    variables.update(kwargs)
    if continue_final_message:
        _append_continue_marker(chat[-1])
    compiled = compile_chat_template(template)
    try:
        rendered = compiled.render(
            messages=chat,
            tools=list(tools) if tools is not None else None,
            documents=list(documents) if documents is not None else None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except TemplateRaisedError as exc:
        raise ValueError(f"chat template refused the conversation: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template failed: {exc}") from None
    except (TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
        # Plain Python errors inside template expressions (e.g. "+" on a str and a list).
        raise ValueError(f"chat template failed: {type(exc).__name__}: {exc}") from None
    if continue_final_message:
        cut = rendered.rfind(_CONTINUE_MARKER)
        if cut < 0:
            raise ValueError("continue_final_message: the chat template does not render the final message's content")
        rendered = rendered[:cut]
    return rendered


def _append_continue_marker(message: dict[str, Any]) -> None:
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = content + _CONTINUE_MARKER
        return
    if isinstance(content, list):
        # Content blocks: continue the last text block.
        blocks = [dict(block) if isinstance(block, Mapping) else block for block in content]
        for block in reversed(blocks):
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                block["text"] = block["text"] + _CONTINUE_MARKER
                message["content"] = blocks
                return
    raise ValueError("continue_final_message: the final message has no text content to continue")
