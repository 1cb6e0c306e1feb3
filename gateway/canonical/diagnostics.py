"""Prefix diagnostics: where a request's canonical prompt first departs from the session's
previous request, and how many of its tokens were reusable.

A request is cut into canonical segments in prompt order: the `system` prompt, the `tools`
(templates write them into the system turn, after its text), each other message
(`message[i]`), then the `volatile-note`. The previous request of the same session is
cut the same way, followed by an `output` segment: the assistant message its generation
produced, as the client would send it back. The first segment whose digest differs names what
broke the prefix:

- `tools` / `system`: the tool list or the system prompt changed (e.g. shuffled tools with
  canonicalization off, or a timestamp in the system prompt);
- `message[i]`: the history was edited at message i;
- `output`: the client sent the previous answer back differently from how it was generated
  (a render-stability problem);
- `volatile-note`: only the trailing note stood in the way (expected under policy safe);
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


def conversation_segments(canonical: CanonicalConversation) -> list[Segment]:
    """The canonical segments of a request, in prompt order: the system prompt, then the tools
    (templates write the tool block after the system text, inside the system turn), then the
    other messages and the volatile note."""
    segments: list[Segment] = []
    tools: Segment = ("tools", _digest(canonical.tools or []))
    for index, message in enumerate(canonical.messages):
        if index == 0 and message.get("role") == "system" and not message.get(NOTE_KEY):
            segments += [("system", message_digest(message)), tools]
            continue
        if index == 0:
            segments.append(tools)
        if message.get(NOTE_KEY):
            segments.append((VOLATILE_NOTE, _digest(message["content"])))
        else:
            segments.append((f"message[{index}]", message_digest(message)))
    return segments or [tools]


def output_segment(content: str | None, tool_calls: Sequence[tuple[str, str]]) -> Segment:
    """The assistant message a generation produced: content and (name, arguments) calls."""
    message = {"role": "assistant", "content": content or "",
               "tool_calls": [{"function": {"name": name, "arguments": arguments}} for name, arguments in tool_calls]}
    return ("output", message_digest(message))


def first_divergence(previous: Sequence[Segment] | None, current: Sequence[Segment]) -> str:
    """The name of the first segment where `current` departs from `previous` (which ends with
    the previous request's output segment).

    The volatile note sits at the end of a prompt, so the next turn's messages always take its
    place: notes are set aside while comparing, and reported only when nothing else differs.
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
    return VOLATILE_NOTE if len(previous_rest) < len(previous) else NO_DIVERGENCE


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
