"""Agent sessions: who a request belongs to, what its previous turn was, what to retain.

A session is named, in this order, by the `x-session-id` header; by the request's `metadata`
(session_id, conversation_id, thread_id or user_id: Claude Code sends its session in
metadata.user_id); by the OpenAI `user` field; else it is derived from the canonical prefix: the
engine's block key (engine.core.block_hash) over the tokens of the tools, the system prompt and
the first user message, which every turn of one conversation repeats.

For each request the registry keeps the session's previous turn: its canonical segments, the
prefix-cache keys of its prompt plus generated tokens, and where its volatile notes stood. Under
policy safe a new request gets those notes back in place (gateway/canonical/pipeline.py,
`with_pinned_notes`), where its messages still match, so the previous prompt and output repeat
token for token; it is then compared with the previous turn
(gateway/canonical/diagnostics.py) for the response's prefix report. A turn that may end in a
tool call asks the engine to retain its KV blocks (engine/core/session_retention.py) for the
TTL: when the tool's result comes back, the next turn finds its prefix even if other traffic
filled the cache meanwhile, and it is scheduled ahead of its priority class.
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engine.core.block_hash import hash_block_tokens, hash_token_blocks, root_hash
from engine.protocol import RetentionSpec
from gateway.canonical.diagnostics import (
    PrefixReport,
    Segment,
    conversation_segments,
    first_divergence,
    message_digest,
    output_segment,
    reusable_tokens,
    tool_list_digest,
)
from gateway.canonical.pipeline import CanonicalConversation, with_pinned_notes
from gateway.chat_prompt import ChatPrompt, render_chat_prompt_async
from gateway.state import GatewayState
from gateway.tool_prompt import ToolChoice
from gateway.tools import TOOL_CALL_START

SESSION_HEADER = "x-session-id"
METADATA_SESSION_KEYS = ("session_id", "conversation_id", "thread_id", "user_id")
MAX_SESSION_ID_CHARS = 256
DEFAULT_BLOCK_SIZE = 16  # for engines that do not say (the gateway benchmark's stand-in)


class _SessionFields(msgspec.Struct):
    """The body fields that name a session, read apart from the route's own schema."""

    user: str | None = None
    metadata: dict[str, Any] | None = None


_session_fields_decoder = msgspec.json.Decoder(_SessionFields)


def explicit_session(headers: Mapping[str, str], body: bytes) -> tuple[str, str] | None:
    """(session id, source) named by the request itself, or None."""
    header = headers.get(SESSION_HEADER)
    if header and header.strip():
        return header.strip()[:MAX_SESSION_ID_CHARS], "header"
    try:
        fields = _session_fields_decoder.decode(body)
    except msgspec.DecodeError:
        return None  # the route's own decoder has accepted the body; odd types here are ignored
    if fields.metadata:
        for key in METADATA_SESSION_KEYS:
            value = fields.metadata.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()[:MAX_SESSION_ID_CHARS], "metadata"
    if fields.user and fields.user.strip():
        return fields.user.strip()[:MAX_SESSION_ID_CHARS], "user"
    return None


def prefix_key(token_ids: Sequence[int], block_size: int, seed: str, cache_salt: str | None) -> str:
    """The engine's key of a token prefix: its last full block's key (or, for a prefix shorter
    than one block, the key of that partial block), hex."""
    num_full = len(token_ids) // block_size
    if num_full:
        key = hash_token_blocks(token_ids[: num_full * block_size], block_size, seed, cache_salt)[-1]
    else:
        salt = cache_salt.encode("utf-8") if cache_salt is not None else None
        key = hash_block_tokens(root_hash(seed), token_ids, salt)
    return key.hex()[:32]


@dataclass
class _Turn:
    segments: list[Segment]  # the request's canonical segments plus its output segment
    block_hashes: list[bytes]  # keys of its prompt + generated tokens
    updated_at: float
    # What its notes followed: the digest of the tools and of each client message (its output
    # last), and (client messages before it, text) of each note.
    tools_digest: bytes = b""
    message_digests: list[bytes] = field(default_factory=list)
    notes: list[tuple[int, str]] = field(default_factory=list)


class SessionRegistry:
    """The previous turn of each recent session; bounded in count and idle time (LRU)."""

    def __init__(self, max_sessions: int = 4096, idle_seconds: float = 3600.0) -> None:
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self._turns: collections.OrderedDict[str, _Turn] = collections.OrderedDict()

    def previous(self, session_id: str) -> _Turn | None:
        turn = self._turns.get(session_id)
        if turn is None:
            return None
        if time.monotonic() - turn.updated_at > self.idle_seconds:
            del self._turns[session_id]
            return None
        return turn

    def record(self, session_id: str, turn: _Turn) -> None:
        self._turns[session_id] = turn
        self._turns.move_to_end(session_id)
        while len(self._turns) > self.max_sessions:
            self._turns.popitem(last=False)

    def __len__(self) -> int:
        return len(self._turns)


_registries: weakref.WeakKeyDictionary[GatewayState, SessionRegistry] = weakref.WeakKeyDictionary()


def registry_for(state: GatewayState) -> SessionRegistry:
    registry = _registries.get(state)
    if registry is None:
        registry = _registries[state] = SessionRegistry(state.config.max_sessions)
    return registry


@dataclass
class SessionTurn:
    """One request's place in its session: the prefix report and what to tell the engine."""

    registry: SessionRegistry
    session_id: str
    report: PrefixReport
    retention: RetentionSpec | None
    segments: list[Segment]
    prompt_token_ids: list[int]
    block_size: int
    seed: str
    cache_salt: str | None
    is_tool_turn: bool = False
    tools_digest: bytes = b""
    message_digests: list[bytes] = field(default_factory=list)
    notes: list[tuple[int, str]] = field(default_factory=list)
    finished: bool = field(default=False)

    def extension(self) -> dict[str, Any] | None:
        """The response's `draftgate` field, for agent traffic: a turn with tools or a session the
        client named. A plain chat request keeps the vendor's exact body (the headers still report)."""
        if self.is_tool_turn or self.report.session_source != "derived":
            return self.report.extension()
        return None

    def finish(self, content: str | None, tool_calls: Sequence[tuple[str, str]], output_token_ids: Sequence[int]) -> None:
        """Records this turn (with what it generated) as the session's previous turn."""
        if self.finished:
            return
        self.finished = True
        stream = self.prompt_token_ids + list(output_token_ids)
        block_hashes = hash_token_blocks(stream, self.block_size, self.seed, self.cache_salt)
        output = output_segment(content, tool_calls)
        self.registry.record(self.session_id, _Turn([*self.segments, output], block_hashes, time.monotonic(),
                                                    self.tools_digest, [*self.message_digests, output[1]],
                                                    self.notes))


Render = Callable[[CanonicalConversation], Awaitable[ChatPrompt]]


async def open_turn(
    state: GatewayState,
    headers: Mapping[str, str],
    body: bytes,
    canonical: CanonicalConversation,
    render: Render,
    cache_salt: str | None = None,
) -> tuple[SessionTurn, CanonicalConversation, ChatPrompt]:
    """Identifies the request's session, puts the session's earlier notes back in place, renders
    the prompt, compares it with the session's previous turn, and decides whether the engine
    should retain this turn's blocks. Returns the turn and the conversation and prompt to run."""
    engine = state.serving_engine()
    block_size = int(getattr(engine, "block_size", 0) or DEFAULT_BLOCK_SIZE)
    seed = str(getattr(engine, "block_hash_seed", "") or engine.model_name)
    prompt = await render(canonical)
    identity = explicit_session(headers, body)
    if identity is None:
        prefix_ids = await _session_prefix_token_ids(engine.tokenizer, canonical, prompt)
        identity = "prefix-" + prefix_key(prefix_ids, block_size, seed, cache_salt), "derived"
    session_id, source = identity
    registry = registry_for(state)
    previous = registry.previous(session_id)
    tools_digest = tool_list_digest(canonical.tools)
    message_digests = [message_digest(message) for message in canonical.conversation_messages]
    if previous is not None and previous.notes:
        pinned = with_pinned_notes(canonical, _still_valid_notes(previous, tools_digest, message_digests))
        if pinned is not canonical:
            canonical = pinned
            prompt = await render(canonical)
    segments = conversation_segments(canonical)
    block_hashes = hash_token_blocks(prompt.token_ids, block_size, seed, cache_salt)
    report = PrefixReport(
        session_id=session_id, session_source=source, policy=canonical.policy.label,
        diverged_segment=first_divergence(previous.segments if previous else None, segments),
        reusable_tokens=reusable_tokens(previous.block_hashes if previous else None, block_hashes, block_size,
                                        len(prompt.token_ids)),
        prompt_tokens=len(prompt.token_ids), rules_applied=tuple(canonical.rules_applied),
    )
    retention = None
    config = state.config
    if prompt.parse_tools and config.session_retention_seconds > 0:
        # A forced call (the prefill opened it) always ends in a tool call; otherwise only an
        # output that writes the tool-call tag does.
        require_text = None if TOOL_CALL_START in prompt.prefill else TOOL_CALL_START
        retention = RetentionSpec(config.session_retention_seconds, config.session_retention_max_fraction,
                                  require_text)
    state.metrics.observe_prefix(report.diverged_segment, report.reusable_tokens, report.prompt_tokens,
                                 report.rules_applied)
    turn = SessionTurn(registry, session_id, report, retention, segments, list(prompt.token_ids), block_size,
                       seed, cache_salt, is_tool_turn=prompt.parse_tools, tools_digest=tools_digest,
                       message_digests=message_digests, notes=canonical.note_positions())
    return turn, canonical, prompt


def _still_valid_notes(previous: _Turn, tools_digest: bytes, message_digests: Sequence[bytes]) -> list[tuple[int, str]]:
    """The previous turn's notes whose preceding messages (and tools) this request repeats."""
    if previous.tools_digest != tools_digest:
        return []
    valid = []
    for position, text in previous.notes:
        if message_digests[:position] != previous.message_digests[:position]:
            break  # every later note follows the differing message too
        valid.append((position, text))
    return valid


async def _session_prefix_token_ids(tokenizer: Any, canonical: CanonicalConversation, prompt: ChatPrompt) -> list[int]:
    """Token ids of the conversation's opening: tools, system prompt and first user message
    (rendered as a prompt of its own, as the session's first turn was)."""
    messages = canonical.conversation_messages
    end = next((index + 1 for index, message in enumerate(messages) if message.get("role") == "user"),
               len(messages))
    if end == len(canonical.messages) and not prompt.prefill and prompt.parse_tools == bool(canonical.tools):
        return prompt.token_ids  # this is the first turn, rendered already
    tool_choice = ToolChoice("auto" if canonical.tools else "none")
    prefix = await render_chat_prompt_async(tokenizer, messages[:end], canonical.tools or None, tool_choice)
    return prefix.token_ids


def session_extras(turn: SessionTurn, prompt: ChatPrompt, structured_output: Any) -> dict[str, Any]:
    """The engine request options of a chat turn: the grammar, and for a tool-loop turn its
    session and retention (plain chat sends none, so any EngineClient can serve it)."""
    extras: dict[str, Any] = {"structured_output": structured_output}
    if prompt.parse_tools:
        extras["session_id"] = turn.session_id
        extras["retention"] = turn.retention
    return extras
