"""The pool of KV-cache blocks: reference counts, an LRU free queue and the prefix-cache map.

Invariants (checked by tests after every operation):
- a block is in the free queue  <=>  its ref_cnt == 0;
- the free queue is in eviction order: its head is reused first. Callers free a request's blocks
  tail first, so a freed request's last (least shareable) blocks are evicted before its prefix;
- a block keeps its hash while free and stays findable through `get_cached_block` (a prefix hit
  then takes it back out of the free queue); the hash is dropped only when the block is popped
  for reuse, or when the caller uncaches it because its contents were never computed;
- `cached_block_hash_to_block[h].block_hash == h` for every entry. When two blocks end up with the
  same contents (two requests computed the same prefix at the same time), the first registered
  one keeps the key and the other stays unhashed: one key never points at two blocks.

Blocks are identified by ints 0..num_blocks-1 (the worker indexes its KV tensors with them);
initially all are free in ascending order. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.request import BlockHash, Request


class KVCacheBlock:
    """One block of `block_size` token slots in every layer's KV tensors."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # number of requests whose block table holds this block
        self.block_hash: BlockHash | None = None  # set while registered in the prefix cache
        # Links of the free queue; both None while the block is not in it.
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        hash_text = self.block_hash.hex()[:8] if self.block_hash is not None else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={hash_text})"


class FreeBlockQueue:
    """Doubly linked list of free blocks in eviction order (head = next to reuse).

    O(1) popleft, append and removal from the middle (a prefix hit on a free block). A deque
    cannot remove from the middle in O(1), hence the intrusive links.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        # Sentinels avoid every None check at the ends.
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks left")
        self.remove(block)
        return block

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        assert last is not None and block.prev_free is None and block.next_free is None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def remove(self, block: KVCacheBlock) -> None:
        prev_block, next_block = block.prev_free, block.next_free
        if prev_block is None or next_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev_block.next_free = next_block
        next_block.prev_free = prev_block
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}

    # ---- allocation --------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Takes `num_blocks` blocks from the head of the free queue (evicting their cached
        contents) and gives each ref_cnt 1."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(
                f"cannot allocate {num_blocks} blocks: only {self.free_block_queue.num_free_blocks} are free"
            )
        new_blocks: list[KVCacheBlock] = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A request starts using already-cached blocks (a prefix hit)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: Iterable[KVCacheBlock]) -> None:
        """Drops one reference from each block; blocks reaching 0 join the free queue's tail in
        the order given (the first one given is evicted first)."""
        for block in blocks_in_eviction_order:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than it was taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    # ---- prefix cache ------------------------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        if not self.enable_caching:
            return None
        return self.cached_block_hash_to_block.get(block_hash)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Registers blocks[num_cached_blocks:num_full_blocks] of `request` under the request's
        block hashes at the same indices. Blocks before num_cached_blocks are already registered
        (or were hits); a block whose key is taken by another block stays unhashed."""
        if not self.enable_caching:
            return
        if num_full_blocks > len(request.block_hashes):
            raise ValueError(
                f"request {request.request_id!r} has {len(request.block_hashes)} block hashes, "
                f"cannot cache {num_full_blocks} full blocks"
            )
        for block_index in range(num_cached_blocks, num_full_blocks):
            block = blocks[block_index]
            if block.block_hash is not None:
                continue
            block_hash = request.block_hashes[block_index]
            if block_hash in self.cached_block_hash_to_block:
                continue
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Makes a block unfindable (its contents will never be computed)."""
        self._evict(block)

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix. Refused (False) while any block is in use, because a
        running request's blocks would lose their keys mid-flight."""
        if self.free_block_queue.num_free_blocks != self.num_blocks:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.block_hash = None
        return True

    # ---- accounting --------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0 (including cached ones that a new allocation would evict)."""
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by some request, in [0, 1]."""
        return (self.num_blocks - self.free_block_queue.num_free_blocks) / self.num_blocks
