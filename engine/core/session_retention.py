"""Keeping an agent session's KV blocks warm while its tool runs. Torch-free.

An agent turn that ends in tool calls is followed, a few seconds later, by the session's next
turn, whose prompt starts with everything the finished turn held. Between the two the session
owns no running request, so its blocks sit in the free queue and other traffic evicts them (LRU)
long before the tool returns. `SessionRetention` pins them instead: each retained block gets one
extra reference, so it is neither free nor evictable, until one of these happens:

- the session's next request is admitted (it now holds the blocks it hit: `release`);
- the TTL passes (`expire`, called every step and when stats are read);
- the pool runs dry for running requests, or for a waiting request while nothing runs
  (`release_oldest`, before the scheduler preempts anyone);
- a new retention would push the retained total past its cap (oldest sessions go first);
- the prefix cache is reset (`release_all`).

Blocks are found by their prefix-cache keys (`BlockPool.get_cached_block`), so what is pinned is
exactly what a later lookup of the same keys finds. Two sessions sharing a prefix (the same
tools and system prompt) pin the same blocks twice; a block is released when both let go.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.block_pool import BlockPool, KVCacheBlock
    from engine.request import BlockHash, Request

# The default cap on retained blocks, as a fraction of the pool: new traffic always keeps the
# rest, and retention never starves it.
DEFAULT_MAX_RETAINED_FRACTION = 0.25


@dataclass
class RetainedSession:
    session_id: str
    blocks: list[KVCacheBlock]  # in prefix order; each holds one reference of ours
    expires_at: float  # clock time after which the pins are dropped


class SessionRetention:
    """Pins of retained sessions on a BlockPool; see the module docstring for the lifecycle."""

    def __init__(self, block_pool: BlockPool, clock: Callable[[], float] = time.monotonic) -> None:
        self.block_pool = block_pool
        self.clock = clock
        # Oldest retention first: pressure and the cap release from the front.
        self.sessions: collections.OrderedDict[str, RetainedSession] = collections.OrderedDict()
        # block_id -> how many sessions pin it (a shared prefix is pinned once per session).
        self._pin_counts: dict[int, int] = {}
        # Cumulative counters, for stats.
        self.num_retained = 0  # retentions made
        self.num_expired = 0  # released by the TTL
        self.num_released_for_pressure = 0  # released early to make room

    # ---- retaining ---------------------------------------------------------------------------
    def retain(
        self,
        session_id: str,
        block_hashes: Sequence[BlockHash],
        ttl_seconds: float,
        max_retained_fraction: float = DEFAULT_MAX_RETAINED_FRACTION,
    ) -> int:
        """Pins the cached blocks of the longest cached prefix among `block_hashes` for
        `ttl_seconds`; returns how many blocks are pinned for the session now (0: nothing kept).

        The session's earlier retention, if any, is replaced. Never more than
        max_retained_fraction of the pool is pinned in all: older sessions are released to make
        room, and a prefix longer than the cap keeps only its first blocks.
        """
        if ttl_seconds <= 0:
            self.release(session_id)
            return 0
        if not 0.0 <= max_retained_fraction <= 1.0:
            raise ValueError(f"max_retained_fraction must be in [0, 1], got {max_retained_fraction}")
        max_blocks = int(self.block_pool.num_blocks * max_retained_fraction)
        blocks: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break  # the chain is broken here: later blocks could never be hit
            blocks.append(block)
        # Pin the new blocks before dropping the old pins, so blocks both share never pass
        # through the free queue (where they could be popped in between).
        previous = self.sessions.pop(session_id, None)
        self._pin(blocks)
        if previous is not None:
            self._unpin(previous.blocks)
        if not blocks:
            return 0
        now = self.clock()
        self.sessions[session_id] = RetainedSession(session_id, blocks, now + ttl_seconds)
        self.num_retained += 1
        # Enforce the cap by releasing the oldest other sessions.
        while self.num_pinned_blocks > max_blocks and len(self.sessions) > 1:
            oldest = next(iter(self.sessions))
            if oldest == session_id:
                break
            self.release(oldest)
        return len(blocks)

    def release(self, session_id: str | None) -> int:
        """Drops a session's pins (its next turn was admitted, or it ended); returns the number
        of blocks unpinned."""
        if session_id is None:
            return 0
        session = self.sessions.pop(session_id, None)
        if session is None:
            return 0
        self._unpin(session.blocks)
        return len(session.blocks)

    def release_all(self) -> None:
        for session_id in list(self.sessions):
            self.release(session_id)

    def expire(self, now: float | None = None) -> list[str]:
        """Releases every session whose TTL has passed; returns their ids."""
        now = self.clock() if now is None else now
        expired = [session_id for session_id, session in self.sessions.items() if session.expires_at <= now]
        for session_id in expired:
            self.release(session_id)
        self.num_expired += len(expired)
        return expired

    def release_oldest(self) -> bool:
        """Pressure valve: releases the oldest retained session; False when none is left."""
        if not self.sessions:
            return False
        self.release(next(iter(self.sessions)))
        self.num_released_for_pressure += 1
        return True

    # ---- queries -----------------------------------------------------------------------------
    def is_retained(self, session_id: str | None) -> bool:
        """Whether the session has live pins (its TTL not passed yet)."""
        if session_id is None:
            return False
        session = self.sessions.get(session_id)
        return session is not None and session.expires_at > self.clock()

    def retained_block_ids(self, session_id: str) -> list[int]:
        session = self.sessions.get(session_id)
        return [block.block_id for block in session.blocks] if session is not None else []

    @property
    def num_sessions(self) -> int:
        return len(self.sessions)

    @property
    def num_pinned_blocks(self) -> int:
        """Distinct blocks pinned by at least one session."""
        return len(self._pin_counts)

    @property
    def num_retained_only_blocks(self) -> int:
        """Pinned blocks that no request holds: memory kept only for retention (reclaimable)."""
        blocks = self.block_pool.blocks
        return sum(1 for block_id, pins in self._pin_counts.items() if blocks[block_id].ref_cnt == pins)

    # ---- internals ---------------------------------------------------------------------------
    def _pin(self, blocks: list[KVCacheBlock]) -> None:
        self.block_pool.touch(blocks)
        for block in blocks:
            self._pin_counts[block.block_id] = self._pin_counts.get(block.block_id, 0) + 1

    def _unpin(self, blocks: list[KVCacheBlock]) -> None:
        # Tail first, like a request's own free: the end of a prefix is evicted before its start.
        ordered = list(reversed(blocks))
        for block in ordered:
            count = self._pin_counts[block.block_id] - 1
            if count:
                self._pin_counts[block.block_id] = count
            else:
                del self._pin_counts[block.block_id]
        self.block_pool.free_blocks(ordered)


@dataclass
class _Turn:
    session_id: str
    request: Request
    ttl_seconds: float
    max_retained_fraction: float
    require_text: str | None
    seen_text: bool  # require_text appeared in the output (always True without require_text)
    tail: str = ""  # the output's last characters, to find require_text split across deltas


class SessionTurns:
    """The running requests that are agent turns, and the retention each asks for at its end.

    The engine core feeds every request's output text (`on_text`) and finish (`on_finish`). A
    turn that stopped on its own and, when asked, wrote `require_text` (the tool-call tag) gets
    its computed prefix retained; any other ending (length, abort, error, no tool call) retains
    nothing. Called right after the scheduler freed the request's blocks and before anything
    else allocates, so the blocks are still cached.
    """

    def __init__(self, retention: SessionRetention, block_size: int) -> None:
        self.retention = retention
        self.block_size = block_size
        self._turns: dict[str, _Turn] = {}

    def add(self, request: Request, session_id: str, ttl_seconds: float, max_retained_fraction: float,
            require_text: str | None = None) -> None:
        self._turns[request.request_id] = _Turn(session_id, request, ttl_seconds, max_retained_fraction,
                                                require_text or None, seen_text=not require_text)

    def on_text(self, request_id: str, text: str) -> None:
        turn = self._turns.get(request_id)
        if turn is None or turn.seen_text or not text or turn.require_text is None:
            return
        window = turn.tail + text
        if turn.require_text in window:
            turn.seen_text = True
        turn.tail = window[-(len(turn.require_text) - 1):] if len(turn.require_text) > 1 else ""

    def on_finish(self, request_id: str, finish_reason: str | None) -> int:
        """Retains the finished turn's prefix when it qualifies; returns the blocks pinned."""
        turn = self._turns.pop(request_id, None)
        if turn is None or finish_reason != "stop" or not turn.seen_text:
            return 0
        request = turn.request
        num_computed_blocks = request.num_computed_tokens // self.block_size
        return self.retention.retain(turn.session_id, request.block_hashes[:num_computed_blocks], turn.ttl_seconds,
                                     turn.max_retained_fraction)

    def drop(self, request_id: str) -> None:
        self._turns.pop(request_id, None)
