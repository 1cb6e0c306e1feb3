"""Per-request block tables on top of the BlockPool: prefix hits, slot allocation, freeing.

The scheduler talks to this class only; it sees block ids (ints) and opaque computed-prefix
blocks it hands back to `allocate_slots`. One block table per request serves every KV pool (the
target's and the draft's), so this bookkeeping covers both.

Why blocks are registered in the prefix cache when they are *allocated*, before the step runs:
the model writes the KV of every scheduled token at each layer before that layer's attention
reads, so a request admitted later in the same step may already share those blocks. The one
case where registered contents are never computed (a request freed before its scheduled step's
output came back, e.g. preempted in the same schedule()) is repaired in `free`, which uncaches
blocks beyond the request's computed tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.block_pool import BlockPool, KVCacheBlock
from engine.core.session_retention import SessionRetention

if TYPE_CHECKING:
    from engine.request import Request


def cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        # Agent sessions whose blocks are pinned while their tool runs (see session_retention.py).
        self.retention = SessionRetention(self.block_pool)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are already registered (or were hits), so each
        # allocation only looks at the blocks that just became full.
        self.num_cached_blocks: dict[str, int] = {}
        # Cumulative, in tokens: prompt tokens looked up at admission, and those found cached.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ---- prefix lookup -----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of `request` as (blocks, num_computed_tokens).

        Never the whole sequence: the last token must be computed to produce logits, so the hit
        is capped at num_tokens - 1 tokens, dropping the last full block when the whole prompt
        is cached. Stats are counted in `allocate_slots`, when the request is actually admitted
        (a request that waits for blocks is looked up again every step).
        """
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hit_blocks: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hit_blocks.append(block)
        return hit_blocks, len(hit_blocks) * self.block_size

    # ---- allocation --------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Makes room for `num_new_tokens` more tokens (plus `num_lookahead_tokens` slots for
        draft tokens a proposer will write) after the request's computed tokens and the new
        computed prefix. Returns the ids of the newly allocated blocks (possibly empty), or None,
        changing nothing, when the pool lacks blocks. Cached blocks with ref_cnt 0 that the
        prefix hit would take count as not free.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        computed_blocks = new_computed_blocks or []
        if num_new_computed_tokens != len(computed_blocks) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens ({num_new_computed_tokens}) must equal the tokens of the "
                f"{len(computed_blocks)} computed blocks given"
            )
        request_id = request.request_id
        held_blocks = self.req_to_blocks.get(request_id)
        num_held_blocks = len(held_blocks) if held_blocks is not None else 0
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_required_blocks = cdiv(num_computed_tokens + num_new_tokens + num_lookahead_tokens, self.block_size)
        num_blocks_to_allocate = max(0, num_required_blocks - num_held_blocks - len(computed_blocks))
        num_evictable_hits = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        if num_blocks_to_allocate + num_evictable_hits > self.block_pool.num_free_blocks:
            return None

        if held_blocks is None:
            held_blocks = self.req_to_blocks[request_id] = []
            if self.enable_caching:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += num_new_computed_tokens
        if computed_blocks:
            self.block_pool.touch(computed_blocks)
            held_blocks.extend(computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_blocks_to_allocate)
        held_blocks.extend(new_blocks)

        if self.enable_caching:
            # Draft tokens may still be rejected: only the real ones count.
            self._register_full_blocks(request, held_blocks, num_computed_tokens + num_new_tokens)
        return [block.block_id for block in new_blocks]

    def _register_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        """Gives keys to the request's blocks full of its first num_tokens tokens (of its own
        tokens only: drafts and tokens computed after a stop are not) that have none yet."""
        num_real_tokens = min(num_tokens, request.num_tokens)
        num_full_blocks = min(num_real_tokens // self.block_size, len(request.block_hashes), len(blocks))
        num_cached_blocks = self.num_cached_blocks.get(request.request_id, 0)
        if num_full_blocks > num_cached_blocks:
            self.block_pool.cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks)
            self.num_cached_blocks[request.request_id] = num_full_blocks

    def free(self, request: Request) -> None:
        """Releases the request's blocks, tail first (its last blocks are the least likely to be
        shared, so they are evicted first). Call before resetting num_computed_tokens: blocks
        whose tokens were scheduled but never computed lose their keys here."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        if blocks and self.enable_caching:
            # Blocks filled by drafts accepted in the request's last step were computed after
            # allocate_slots last registered blocks, and no later step comes: register them now,
            # or the next turn of an agent, whose prompt extends this output, misses them.
            self._register_full_blocks(request, blocks, request.num_computed_tokens)
        self.num_cached_blocks.pop(request.request_id, None)
        if not blocks:
            return
        self.block_pool.free_blocks(reversed(blocks))
        if self.enable_caching:
            num_computed_blocks = request.num_computed_tokens // self.block_size
            for block in blocks[num_computed_blocks:]:
                if block.ref_cnt == 0 and block.block_hash is not None:
                    self.block_pool.uncache_block(block)

    # ---- queries -----------------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, ())]

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests. Blocks pinned only by session retention are left
        out: like cached free blocks, they are given back before anyone is preempted."""
        # In integers first, so that an idle engine reports exactly 0.
        pool = self.block_pool
        held = pool.num_blocks - pool.num_free_blocks - self.retention.num_retained_only_blocks
        return held / pool.num_blocks

    def reset_prefix_cache(self) -> bool:
        self.retention.release_all()
        return self.block_pool.reset_prefix_cache()
