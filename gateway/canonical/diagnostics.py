"""Prefix diagnostics: where a request's canonical prompt first departs from the session's
previous request, and how many of its tokens were reusable.

A request is cut into canonical segments in prompt order: the `system` prompt, the `tools`
(templates write them into the system turn, after its text), each other message
(`message[i]`), and the `volatile-note`s (the trailing one, and under policy safe the notes of the
session's earlier turns pinned where they were; gateway/canonical/pipeline.py). The previous request of the same session is
cut the same way, followed by an `output` segment: the assistant message its generation
produced, as the client would send it back. The first segment whose digest differs names what
broke the prefix:

- `tools` / `system`: the tool list or the system prompt changed (e.g. shuffled tools with
  canonicalization off, or a timestamp in the system prompt);
- `message[i]`: the history was edited at message i;
- `output`: the client sent the previous answer back differently from how it was generated
  (a render-stability problem);
- `volatile-note`: only a note stood in the way (the previous note is not where it was);
- `none`: the request extends the previous one exactly; `new-session`: no previous request.

Reusable tokens are counted in the engine's own hash space: the leading prefix-cache block keys
(engine.core.block_hash.hash_token_blocks over the canonical token ids, with the engine's seed,
block size and the request's cache salt) that this prompt shares with the previous request's
prompt plus generated tokens, times the block size. The engine never serves a whole prompt from
cache (the last token is always recomputed), and the count respects that.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.canonical.canonical_json import canonical_arguments
from gateway.canonical.pipeline import NOTE_KEY, CanonicalConversation

Segment = tuple[str, bytes]  # (name, digest)

NEW_SESSION = "new-session"
NO_DIVERGENCE = "none"
VOLATILE_NOTE = "volatile-note"


def _digest(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def message_digest(message: Mapping[str, Any]) -> bytes:
    """What the template renders of a message: role, content, name, tool calls (name and
    canonical arguments). Ids are left out: the templates render none of them."""
    calls = [
        [call.get("function", {}).get("name"), canonical_arguments(str(call.get("function", {}).get("arguments", "")))]
        for call in message.get("tool_calls") or ()
    ]
    return _digest([message.get("role"), message.get("content") or "", message.get("name"), calls])


def tool_list_digest(tools: Sequence[Mapping[str, Any]] | None) -> bytes:
    return _digest(tools or [])


def conversation_segments(canonical: CanonicalConversation) -> list[Segment]:
    """The canonical segments of a request, in prompt order: the system prompt, then the tools
    (templates write the tool block after the system text, inside the system turn), then the
    other messages (named by their index among the client's messages) and the volatile notes."""
    segments: list[Segment] = []
    tools: Segment = ("tools", tool_list_digest(canonical.tools))
    index = 0  # among the client's messages: notes are the gateway's, not the client's
    for position, message in enumerate(canonical.messages):
        if message.get(NOTE_KEY):
            if position == 0:
                segments.append(tools)
            segments.append((VOLATILE_NOTE, _digest(message["content"])))
            continue
        if index == 0 and message.get("role") == "system":
            segments += [("system", message_digest(message)), tools]
        else:
            if position == 0:
                segments.append(tools)
            segments.append((f"message[{index}]", message_digest(message)))
        index += 1
    return segments or [tools]


def output_segment(content: str | None, tool_calls: Sequence[tuple[str, str]]) -> Segment:
    """The assistant message a generation produced: content and (name, arguments) calls."""
    message = {"role": "assistant", "content": content or "",
               "tool_calls": [{"function": {"name": name, "arguments": arguments}} for name, arguments in tool_calls]}
    return ("output", message_digest(message))


def first_divergence(previous: Sequence[Segment] | None, current: Sequence[Segment]) -> str:
    """The name of the first segment where `current` departs from `previous` (which ends with
    the previous request's output segment).

    The messages are compared first with the notes set aside (the next turn's messages take the
    place of a trailing note unless the session pins it), so an edited message or a re-rendered
    output is named even behind a note. When the messages agree, `volatile-note` says that a
    note of the previous request is not where it was (only the notes stood in the way), `none`
    that the request extends the previous one exactly.
    """
    if previous is None:
        return NEW_SESSION
    previous_rest = [segment for segment in previous if segment[0] != VOLATILE_NOTE]
    current_rest = [segment for segment in current if segment[0] != VOLATILE_NOTE]
    for (previous_name, previous_digest), (current_name, current_digest) in zip(previous_rest, current_rest):
        if previous_digest != current_digest:
            # Where the names agree the current one is precise (message[i]); where they do not,
            # the previous request had something here (its output) that this one does not repeat.
            return current_name if previous_name == current_name else previous_name
    if len(current_rest) < len(previous_rest):
        return previous_rest[len(current_rest)][0]  # the history was cut short
    in_place = len(current) >= len(previous) and all(
        previous_digest == current_digest for (_, previous_digest), (_, current_digest) in zip(previous, current))
    return NO_DIVERGENCE if in_place else VOLATILE_NOTE


def common_prefix_blocks(previous: Sequence[bytes], current: Sequence[bytes]) -> int:
    """Leading block keys the two chains share (chained keys: equal key = equal whole prefix)."""
    count = 0
    for previous_key, current_key in zip(previous, current):
        if previous_key != current_key:
            break
        count += 1
    return count


def reusable_tokens(previous: Sequence[bytes] | None, current: Sequence[bytes], block_size: int,
                    num_prompt_tokens: int) -> int:
    """Prompt tokens a prefix-cache hit on the previous request's blocks can serve."""
    if not previous:
        return 0
    num_blocks = common_prefix_blocks(previous, current)
    # The engine recomputes at least the prompt's last token.
    max_blocks = max(num_prompt_tokens - 1, 0) // block_size
    return min(num_blocks, max_blocks) * block_size


@dataclass(frozen=True)
class PrefixReport:
    """What the response tells about the request's prefix (header and extension field)."""

    session_id: str
    session_source: str  # header, metadata, user or derived
    policy: str
    diverged_segment: str
    reusable_tokens: int
    prompt_tokens: int
    rules_applied: tuple[str, ...]

    def headers(self) -> dict[str, str]:
        return {
            "x-draftgate-session-id": self.session_id,
            "x-draftgate-canonicalization": self.policy,
            "x-draftgate-prefix-diverged": self.diverged_segment,
            "x-draftgate-prefix-reusable-tokens": str(self.reusable_tokens),
        }

    def extension(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "session_source": self.session_source,
            "canonicalization": self.policy,
            "rules_applied": list(self.rules_applied),
            "prefix": {
                "diverged_segment": self.diverged_segment,
                "reusable_tokens": self.reusable_tokens,
                "prompt_tokens": self.prompt_tokens,
            },
        }
