"""Grammars for constrained decoding: JSON schemas, any JSON object, and forced tool calls.

Every builder returns an llguidance grammar (a JSON string) that crosses the engine socket in a
`StructuredOutputSpec`. JSON is generated in one fixed layout, the one `json.dumps` writes
(", " between items, ": " after keys, no other whitespace): the model cannot pad its output with
endless whitespace, and a tool call's arguments come out exactly as the gateway later renders
them in the conversation history, so the next turn's prompt repeats the generated tokens.
Properties come out in the order the schema lists them.

Tool calls follow the gateway's forced-call prefill (gateway/tool_prompt.py): the prompt already
ends with `<tool_call>\n{"name": "` (several tools) or `... "arguments": ` (one named tool), so
the grammar covers only what comes after: the name, the arguments matching that tool's schema,
and the closing `}\n</tool_call>`. The name's characters and the closing text are forced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance

# The JSON layout of json.dumps(obj, ensure_ascii=False).
JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_CALL_CLOSE = "}\n</tool_call>"


def json_schema_grammar(schema: Mapping[str, Any], strict: bool = False) -> str:
    """Output that is one JSON value valid under `schema` ($defs/$ref included). strict: objects
    that do not say otherwise admit no properties beyond those listed (`close_objects`)."""
    value = close_objects(schema) if strict else dict(schema)
    return llguidance.LLMatcher.grammar_from_json_schema(value, overrides=JSON_LAYOUT)


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def close_objects(schema: Any) -> Any:
    """A copy of a JSON schema where every object schema that lists properties and does not set
    additionalProperties gets `"additionalProperties": false`, as OpenAI's strict mode requires.

    Plain JSON Schema lets an object carry any extra property, and a small model given that
    freedom writes made-up keys until max_tokens cuts the call off; a tool's parameters are
    what it declares.
    """
    if not isinstance(schema, dict):
        return schema
    result = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(result.get(key), dict):
            result[key] = {name: close_objects(sub) for name, sub in result[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(result.get(key), list):
            result[key] = [close_objects(sub) for sub in result[key]]
    for key in _SCHEMA_VALUES:
        if isinstance(result.get(key), dict):
            result[key] = close_objects(result[key])
    if "properties" in result and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


def json_object_grammar() -> str:
    """Output that is one JSON object (response_format json_object)."""
    return json_schema_grammar({"type": "object"})


def tool_call_grammar(tools: Sequence[tuple[str, Mapping[str, Any]]], name: str | None) -> str:
    """The rest of a forced tool call after the prefill.

    tools: (name, parameters schema) of every tool offered. name: the function the prefill
    already named (tool_choice naming one function, or "required" with a single tool); None
    when the prefill stops inside the name and the grammar chooses among all tools. Parameter
    schemas are closed (`close_objects`): a call carries the parameters its tool declares.
    """
    schemas = dict(tools)
    if name is not None:
        if name not in schemas:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        body = f"{_json_rule(schemas[name])} {_lark_string(TOOL_CALL_CLOSE)}"
        return llguidance.LLMatcher.grammar_from_lark(f"start: {body}\n")
    if not schemas:
        raise ValueError("tools must not be empty for a forced tool call")
    rules = []
    alternatives = []
    for index, (tool_name, parameters) in enumerate(schemas.items()):
        # The prefill ended with the name's opening quote; json.dumps escapes the name as the
        # history renderer will, without its own opening quote.
        name_text = json.dumps(tool_name, ensure_ascii=False)[1:] + ', "arguments": '
        rules.append(f"call_{index}: {_lark_string(name_text)} {_json_rule(parameters)} {_lark_string(TOOL_CALL_CLOSE)}")
        alternatives.append(f"call_{index}")
    lark = "start: " + " | ".join(alternatives) + "\n" + "\n".join(rules) + "\n"
    return llguidance.LLMatcher.grammar_from_lark(lark)


def validate_grammar(grammar: str) -> str | None:
    """None when the grammar compiles, else the compiler's message (warnings do not count)."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error and messages else None


def _json_rule(schema: Mapping[str, Any]) -> str:
    # llguidance's Lark dialect embeds a JSON schema inline; x-guidance sets the layout for it.
    return "%json " + json.dumps({**close_objects(schema), "x-guidance": JSON_LAYOUT}, ensure_ascii=False)


def _lark_string(text: str) -> str:
    # A Lark string literal: JSON escaping (\" \\ \n) is what Lark accepts; non-ASCII stays as is.
    return json.dumps(text, ensure_ascii=False)
