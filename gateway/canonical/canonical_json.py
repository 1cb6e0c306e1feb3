"""Canonical JSON (RFC 8785 style): object keys in one fixed order, one serialization.

Agent frameworks build tool schemas and tool-call arguments from dicts whose key order depends on
how they were assembled, so the same schema arrives with its keys shuffled from one request to
the next. Sorting keys makes every serializer downstream (the chat template's own json.dumps,
the tool-prompt writer) produce the same bytes. Keys are ordered by their UTF-16 code units, as
RFC 8785 says (this differs from Python's code-point order only for characters outside the BMP).
Arrays keep their order: in JSON an array's order is meaning.
"""

from __future__ import annotations

import json
from typing import Any


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def sort_keys(value: Any) -> Any:
    """A copy of a JSON value with every object's keys in canonical order (arrays as they are)."""
    if isinstance(value, dict):
        return {key: sort_keys(value[key]) for key in sorted(value, key=_utf16_key)}
    if isinstance(value, list):
        return [sort_keys(item) for item in value]
    return value


def canonical_dumps(value: Any) -> str:
    """The canonical text of a JSON value: keys sorted, json.dumps's default separators, no
    ASCII escaping (the layout the chat templates and the tool prompt write)."""
    return json.dumps(sort_keys(value), ensure_ascii=False)


def canonical_arguments(arguments: str) -> str:
    """A tool call's arguments string re-serialized canonically; text that is not a JSON
    object or array is returned unchanged (the template renders it as a string)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(value, (dict, list)):
        return arguments
    return canonical_dumps(value)
