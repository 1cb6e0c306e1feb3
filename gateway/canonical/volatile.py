"""Volatile spans: values in a system prompt that change on every request of the same session.

Agent frameworks stamp their system prompts with the current time, a request or session id, a
nonce, a billing header; one such value near the top turns the whole rest of the prompt into a
cache miss. `find_volatile_spans` finds them; `replace_volatile_spans` swaps each value for a
stable placeholder (`[timestamp-1]`) and returns the values, which the pipeline writes into a
short note at the end of the prompt (policy safe) or drops (policy aggressive).

Placeholders are numbered per kind in order of first appearance, and a value that repeats gets
the same placeholder, so two requests that differ only in their volatile values canonicalize to
the same text. A placeholder contains no digit run that any pattern here matches, so
canonicalizing twice changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"

# (kind, pattern, group): the span is the given group of each match. Earlier patterns win where
# matches overlap (a timestamp is not also read as a date).
_PATTERNS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    # Claude Code's first system block: a per-request billing line. It is transport metadata that
    # Anthropic's API removes before its model sees the prompt, so it is dropped, never moved.
    ("billing-header", re.compile(r"^x-anthropic-billing-header:[^\n]*", re.MULTILINE | re.IGNORECASE), 0),
    ("timestamp", re.compile(
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2}|\s?UTC)?(?![\w:])"), 0),
    ("timestamp", re.compile(  # RFC 2822 / HTTP dates: "Mon, 05 Jan 2026 10:00:00 GMT"
        r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} "
        r"\d{2}:\d{2}:\d{2} (?:GMT|UTC|[+-]\d{4})"), 0),
    ("timestamp", re.compile(r"\b(?:timestamp|epoch|unix[ _]?time|ts)\s*[:=]\s*\"?(\d{10}(?:\d{3})?)\b",
                             re.IGNORECASE), 1),
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), 0),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), 0),
    ("date", re.compile(rf"\b(?:(?:{_DAYS}),?\s+)?(?:{_MONTHS})\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b"), 0),
    ("date", re.compile(rf"\b(?:(?:{_DAYS}),?\s+)?\d{{1,2}}\s+(?:{_MONTHS})\s+\d{{4}}\b"), 0),
    ("id", re.compile(
        r"\b(?:request|req|session|trace|conversation|thread|run|correlation|span)[ _-]?id\s*[:=]\s*[\"']?"
        r"([A-Za-z0-9][A-Za-z0-9_.:-]{4,}[A-Za-z0-9])", re.IGNORECASE), 1),
    ("id", re.compile(r"\b(?:req|sess|session|run|trace|msg|chatcmpl|conv|thread)_[A-Za-z0-9]{8,}\b"), 0),
    ("nonce", re.compile(r"\b(?:nonce|cache[_-]?buster|cch)\s*[:=]\s*[\"']?([A-Za-z0-9_+/=-]{4,})", re.IGNORECASE), 1),
    # Long hex strings (digests, tokens) mixing digits and letters.
    ("nonce", re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{24,}\b"), 0),
)


@dataclass(frozen=True)
class VolatileSpan:
    kind: str
    start: int
    end: int
    value: str


def find_volatile_spans(text: str) -> list[VolatileSpan]:
    """Non-overlapping volatile spans of `text`, in order."""
    taken: list[VolatileSpan] = []
    for kind, pattern, group in _PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span(group)
            if start == end or any(start < span.end and span.start < end for span in taken):
                continue
            taken.append(VolatileSpan(kind, start, end, match.group(group)))
    return sorted(taken, key=lambda span: span.start)


def placeholder(kind: str, number: int) -> str:
    return f"[{kind}-{_ordinal_letters(number)}]"


def _ordinal_letters(number: int) -> str:
    # a, b, ..., z, aa, ab, ...: letters only, so no pattern above can match a placeholder.
    letters = ""
    number -= 1
    while True:
        letters = chr(ord("a") + number % 26) + letters
        number = number // 26 - 1
        if number < 0:
            return letters


def replace_volatile_spans(text: str, values: dict[str, str], strip: bool) -> str:
    """`text` with its volatile spans replaced.

    values: placeholder -> value, shared across the texts of one request (the same value gets the
    same placeholder everywhere) and extended here. strip: drop the values instead (policy
    aggressive): they become their bare kind, e.g. "[timestamp]". A billing-header line is
    removed with its newline either way: it was never meant for the model.
    """
    spans = find_volatile_spans(text)
    if not spans:
        return text
    by_value = {value: name for name, value in values.items()}
    pieces: list[str] = []
    position = 0
    for span in spans:
        pieces.append(text[position:span.start])
        position = span.end
        if span.kind == "billing-header":
            if text.startswith("\n", position):
                position += 1
            continue
        if strip:
            pieces.append(f"[{span.kind}]")
            continue
        name = by_value.get(span.value)
        if name is None:
            number = 1 + sum(1 for existing in values if existing.startswith(f"[{span.kind}-"))
            name = placeholder(span.kind, number)
            values[name] = span.value
            by_value[span.value] = name
        pieces.append(name)
    pieces.append(text[position:])
    return "".join(pieces)
