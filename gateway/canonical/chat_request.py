"""What both chat routes do between normalising a request and rendering its prompt.

`canonical_conversation` applies the request's canonicalization policy (the server's, narrowed by
the `x-draftgate-canonicalization` header). `forced_tool_call_spec` builds the grammar that makes
a forced tool call (tool_choice "required" or a named function) valid for its tool's schema;
`response_format_spec` does the same for OpenAI's json_object / json_schema response formats.
Grammars are checked here, so a schema llguidance cannot compile is a 400 naming the field.
Tool schemas are taken from the canonical tools, so the arguments come out in the same key
order the prompt shows and the next turn renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.protocol import StructuredOutputSpec
from engine.structured_output.grammars import (
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
    validate_grammar,
)
from gateway.canonical.pipeline import CanonicalConversation, canonicalize
from gateway.canonical.policy import POLICY_HEADER, narrow, parse_policy
from gateway.errors import APIError, bad_request
from gateway.tool_prompt import ToolChoice

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def canonical_conversation(server_policy: str, headers: Mapping[str, str], messages: Sequence[dict[str, Any]],
                           tools: Sequence[dict[str, Any]] | None) -> CanonicalConversation:
    """The request's messages and tools under its policy; 400 naming the header when it is bad."""
    try:
        policy = narrow(parse_policy(server_policy), headers.get(POLICY_HEADER))
    except ValueError as error:
        raise bad_request(str(error), param=POLICY_HEADER) from None
    return canonicalize(messages, tools, policy)


def forced_tool_call_spec(tools: Sequence[Mapping[str, Any]] | None, choice: ToolChoice) -> StructuredOutputSpec | None:
    """The grammar of a forced call's remainder after the prefill (None when the model may choose)."""
    if not tools or choice.mode not in ("required", "function"):
        return None
    signatures = []
    for tool in tools:
        function = tool.get("function") or {}
        parameters = function.get("parameters")
        signatures.append((function.get("name", ""), parameters if isinstance(parameters, dict) else EMPTY_PARAMETERS))
    try:
        grammar = tool_call_grammar(signatures, choice.name if choice.mode == "function" else None)
    except ValueError as error:
        raise bad_request(str(error), param="tool_choice") from None
    return _checked(grammar, "tools")


def response_format_spec(kind: str, json_schema: Mapping[str, Any] | None) -> StructuredOutputSpec | None:
    """OpenAI's response_format: "text" (None), "json_object", or "json_schema" with
    {"name", "schema", "strict"} (strict closes objects, as OpenAI's strict mode does); 400
    naming the field for anything else."""
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputSpec(json_object_grammar())
    if kind != "json_schema":
        raise bad_request(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                          param="response_format.type")
    if json_schema is None:
        raise bad_request("response_format json_schema needs a 'json_schema' object", param="response_format.json_schema")
    schema = json_schema.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                          param="response_format.json_schema.schema")
    strict = bool(json_schema.get("strict", False))
    return _checked(json_schema_grammar(schema, strict=strict), "response_format.json_schema.schema")


def _checked(grammar: str, param: str) -> StructuredOutputSpec:
    error = validate_grammar(grammar)
    if error is not None:
        raise APIError(400, f"{param}: the schema cannot be enforced: {error}", param=param)
    return StructuredOutputSpec(grammar)
