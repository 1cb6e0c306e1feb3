"""Benchmarks write their own section of docs/benchmarks.md, between their own markers, and never
touch the other sections."""

from __future__ import annotations

import os

BENCHMARKS_MD = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "benchmarks.md"))


def write_section(name: str, body: str, path: str = BENCHMARKS_MD) -> None:
    """Replaces (or appends) the text between `<!-- {name}:begin -->` and `<!-- {name}:end -->`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{body.strip()}\n{end}"
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
