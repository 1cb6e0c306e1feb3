"""Pinned notes: a session's earlier volatile notes go back where they were, so the previous
prompt and its output repeat token for token (gateway/canonical/pipeline.py, with_pinned_notes)."""

from __future__ import annotations

from gateway.canonical.diagnostics import (
    NO_DIVERGENCE,
    VOLATILE_NOTE,
    conversation_segments,
    first_divergence,
    output_segment,
)
from gateway.canonical.pipeline import NOTE_KEY, canonicalize, note_text, with_pinned_notes
from gateway.canonical.policy import Policy
from tests.gateway.canonical.test_prefix_diagnostics import TOOLS, turn_1, turn_2

T1, T2 = "2026-03-01T10:00:00Z", "2026-03-01T10:00:09Z"


def roles_and_notes(messages: list[dict]) -> list[str]:
    return ["note" if message.get(NOTE_KEY) else message["role"] for message in messages]


def test_note_positions_count_client_messages_only() -> None:
    first = canonicalize(turn_1(T1), TOOLS, Policy.SAFE)
    assert first.note_positions() == [(2, note_text({"[timestamp-a]": T1}))]
    assert len(first.conversation_messages) == 2 and len(first.messages) == 3


def test_the_previous_note_goes_back_after_the_messages_it_followed() -> None:
    pinned_note = canonicalize(turn_1(T1), TOOLS, Policy.SAFE).note_positions()
    second = canonicalize(turn_2(T2), TOOLS, Policy.SAFE)
    pinned = with_pinned_notes(second, pinned_note)
    assert roles_and_notes(pinned.messages) == ["system", "user", "note", "assistant", "tool", "note"]
    assert pinned.messages[2]["content"] == note_text({"[timestamp-a]": T1})
    assert pinned.messages[-1]["content"] == note_text({"[timestamp-a]": T2})  # the current values come last
    assert pinned.conversation_messages == second.conversation_messages
    assert pinned.note_positions() == [(2, pinned_note[0][1]), (4, note_text({"[timestamp-a]": T2}))]


def test_an_unchanged_note_is_not_repeated_at_the_end() -> None:
    pinned = with_pinned_notes(canonicalize(turn_2(T1), TOOLS, Policy.SAFE),
                               canonicalize(turn_1(T1), TOOLS, Policy.SAFE).note_positions())
    assert roles_and_notes(pinned.messages) == ["system", "user", "note", "assistant", "tool"]


def test_a_note_at_or_past_the_end_is_not_pinned() -> None:
    # A retry of the same turn: the trailing slot is this request's own note.
    retry = canonicalize(turn_1(T2), TOOLS, Policy.SAFE)
    assert with_pinned_notes(retry, [(2, note_text({"[timestamp-a]": T1}))]) is retry
    assert with_pinned_notes(retry, [(5, "x")]) is retry
    assert with_pinned_notes(retry, []) is retry


def test_aggressive_and_off_have_no_notes_to_pin() -> None:
    for policy in (Policy.OFF, Policy.AGGRESSIVE):
        conversation = canonicalize(turn_2(T2), TOOLS, policy)
        assert with_pinned_notes(conversation, [(2, "note")]) is conversation


def test_with_the_note_pinned_the_request_extends_the_previous_one_exactly() -> None:
    first = canonicalize(turn_1(T1), TOOLS, Policy.SAFE)
    previous = [*conversation_segments(first), output_segment(None, [("a_tool", '{"city":"Paris"}')])]
    second = canonicalize(turn_2(T2), TOOLS, Policy.SAFE)
    assert first_divergence(previous, conversation_segments(second)) == VOLATILE_NOTE
    pinned = with_pinned_notes(second, first.note_positions())
    assert first_divergence(previous, conversation_segments(pinned)) == NO_DIVERGENCE
    # An edited history is still named, behind the pinned note.
    edited = with_pinned_notes(canonicalize(turn_2(T2, '{"city": "Rome"}'), TOOLS, Policy.SAFE), first.note_positions())
    assert first_divergence(previous, conversation_segments(edited)) == "output"


def test_segments_name_client_messages_whatever_notes_stand_between() -> None:
    pinned = with_pinned_notes(canonicalize(turn_2(T2), TOOLS, Policy.SAFE),
                               canonicalize(turn_1(T1), TOOLS, Policy.SAFE).note_positions())
    names = [name for name, _ in conversation_segments(pinned)]
    assert names == ["system", "tools", "message[1]", VOLATILE_NOTE, "message[2]", "message[3]", VOLATILE_NOTE]
