"""The canonicalization pipeline: rules in order, then the volatile note at the end.

`canonicalize(messages, tools, policy)` returns the conversation the chat template renders.
Under policy safe, values moved out of system prompts travel in one trailing system message,
the volatile note, placed after the whole conversation: everything before it repeats byte for
byte from one turn to the next, and the note (a few dozen tokens) is the only part of the
prompt that a new turn changes besides its new messages.

Canonicalizing a canonical conversation changes nothing: the note is recognised by its first
line, taken off, and written again from the same values.

Within a session the gateway goes one step further (`with_pinned_notes`): the notes of the
session's earlier turns are put back where those turns had them, so the model's own earlier
output, generated right after a note, repeats with the very tokens it was computed over and its
KV stays reusable too. The last note states the current values.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.canonical.policy import Policy
from gateway.canonical.rules import RULES, Conversation

NOTE_HEADER = "Current values of the placeholders above:"
NOTE_KEY = "_volatile_note"  # marks the note message among the dicts (templates ignore it)


@dataclass(frozen=True)
class CanonicalConversation:
    messages: list[dict[str, Any]]  # the note, when there is one, is the last message
    tools: list[dict[str, Any]] | None
    policy: Policy
    rules_applied: list[str] = field(default_factory=list)  # rules that changed something
    volatile_values: dict[str, str] = field(default_factory=dict)  # placeholder -> value

    @property
    def has_note(self) -> bool:
        return bool(self.messages) and bool(self.messages[-1].get(NOTE_KEY))

    @property
    def conversation_messages(self) -> list[dict[str, Any]]:
        """The messages without volatile notes: one per message the client sent."""
        return [message for message in self.messages if not message.get(NOTE_KEY)]

    def note_positions(self) -> list[tuple[int, str]]:
        """(number of client messages before it, text) of each volatile note, in prompt order."""
        positions, num_messages = [], 0
        for message in self.messages:
            if message.get(NOTE_KEY):
                positions.append((num_messages, message["content"]))
            else:
                num_messages += 1
        return positions


def _fingerprint(conversation: Conversation) -> str:
    return json.dumps([conversation.messages, conversation.tools, conversation.volatile_values], ensure_ascii=False,
                      default=repr)


def note_text(values: dict[str, str]) -> str:
    lines = [NOTE_HEADER] + [f"{name} = {value}" for name, value in values.items()]
    return "\n".join(lines)


def _parse_note(text: str) -> dict[str, str] | None:
    lines = text.split("\n")
    if not lines or lines[0] != NOTE_HEADER:
        return None
    values: dict[str, str] = {}
    for line in lines[1:]:
        name, separator, value = line.partition(" = ")
        if not separator:
            return None
        values[name] = value
    return values


def canonicalize(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    policy: Policy,
    disabled_rules: Collection[str] = (),
) -> CanonicalConversation:
    """Applies every rule the policy allows (minus `disabled_rules`) in order; pure."""
    message_list = list(messages)
    carried: dict[str, str] = {}
    last = message_list[-1] if message_list else None
    if (policy >= Policy.SAFE and last is not None and last.get("role") == "system"
            and isinstance(last.get("content"), str)):
        parsed = _parse_note(last["content"])
        if parsed is not None:  # a conversation canonicalized before: start from its values
            carried = parsed
            message_list = message_list[:-1]
    conversation = Conversation(message_list, list(tools) if tools is not None else None, dict(carried))
    applied: list[str] = []
    for rule in RULES:
        if policy < rule.min_policy or rule.name in disabled_rules:
            continue
        changed = rule.apply(conversation, policy)
        # Key order is the point of some rules, and dict equality ignores it: compare the text.
        if _fingerprint(changed) != _fingerprint(conversation):
            applied.append(rule.name)
        conversation = changed
    result_messages = list(conversation.messages)
    if conversation.volatile_values and policy >= Policy.SAFE:
        result_messages.append(note_message(note_text(conversation.volatile_values)))
    return CanonicalConversation(result_messages, conversation.tools, policy, applied,
                                 dict(conversation.volatile_values))


def note_message(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text, NOTE_KEY: True}


def with_pinned_notes(canonical: CanonicalConversation, pinned: Sequence[tuple[int, str]]) -> CanonicalConversation:
    """The conversation with earlier turns' notes back in place: each (n, text) of `pinned` goes
    after the first n client messages (the caller has checked that those messages are the ones
    the note followed). Notes at or past the end are left out: the trailing slot is this turn's.
    This turn's note follows unless it repeats the last pinned one (the values have not changed).
    """
    messages = canonical.conversation_messages
    kept = sorted(((position, text) for position, text in pinned if position < len(messages)),
                  key=lambda note: note[0])
    if not kept or not canonical.volatile_values:
        return canonical  # nothing was moved (policy off or aggressive): no placeholders to give values for
    result: list[dict[str, Any]] = []
    notes = iter(kept)
    pending = next(notes, None)
    for index, message in enumerate(messages):
        while pending is not None and pending[0] == index:
            result.append(note_message(pending[1]))
            pending = next(notes, None)
        result.append(message)
    if canonical.has_note and canonical.messages[-1]["content"] != kept[-1][1]:
        result.append(canonical.messages[-1])
    return CanonicalConversation(result, canonical.tools, canonical.policy, list(canonical.rules_applied),
                                 dict(canonical.volatile_values))
