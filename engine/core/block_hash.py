"""Prefix-cache keys: chained SHA-256 hashes of full blocks of token ids.

    h_{-1} = sha256("draftgate-prefix-cache-v1" || seed)                 (root_hash)
    h_i    = sha256(h_{i-1} || n || token ids of block i || [1 || extra])  (hash_block_tokens)

where n is the number of tokens (uint32, little-endian) and every token id is a little-endian
uint32. Because h_i covers h_{i-1}, equal keys mean equal *whole prefixes*, not just equal blocks,
so one dict lookup per block is a sound prefix match. The root depends on a per-model seed so two
models never share keys; an optional per-request `cache_salt` is mixed into the first block (and
so, through the chain, into every key) to keep tenants apart.

The gateway reuses `hash_token_blocks` over the canonical token stream for its session and routing
keys: one hash space for both. Only the standard library is used (no torch).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.request import BlockHash, Request

_ROOT_DOMAIN = b"draftgate-prefix-cache-v1\x00"
_EXTRA_MARKER = b"\x01"  # separates "no extra" from "empty extra"


def root_hash(seed: str | bytes) -> bytes:
    """The chain's root for one model. Different seeds give unrelated key spaces."""
    seed_bytes = seed.encode("utf-8") if isinstance(seed, str) else bytes(seed)
    return hashlib.sha256(_ROOT_DOMAIN + seed_bytes).digest()


def _token_packer(num_tokens: int) -> struct.Struct:
    # uint32 covers every real vocabulary; struct raises on an out-of-range id instead of
    # silently wrapping it into another token's key.
    return struct.Struct(f"<I{num_tokens}I")


def _hash_packed(parent: bytes, packed_tokens: bytes, extra: bytes | None) -> bytes:
    hasher = hashlib.sha256(parent)
    hasher.update(packed_tokens)
    if extra is not None:
        hasher.update(_EXTRA_MARKER)
        hasher.update(extra)
    return hasher.digest()


def hash_block_tokens(parent: bytes, token_ids: Sequence[int], extra: bytes | None = None) -> bytes:
    """Key of one block given its parent's key (or the root), its token ids and optional extra
    bytes (the cache salt for the first block)."""
    try:
        packed = _token_packer(len(token_ids)).pack(len(token_ids), *token_ids)
    except struct.error as exc:
        raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
    return _hash_packed(parent, packed, extra)


def _salt_bytes(cache_salt: str | None) -> bytes | None:
    return None if cache_salt is None else cache_salt.encode("utf-8")


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int,
    seed: str | bytes,
    cache_salt: str | None = None,
) -> list[bytes]:
    """Keys of every full block of `token_ids` (a trailing partial block has no key)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    parent = root_hash(seed)
    salt = _salt_bytes(cache_salt)
    packer = _token_packer(block_size)
    hashes: list[bytes] = []
    for block_index in range(len(token_ids) // block_size):
        start = block_index * block_size
        try:
            packed = packer.pack(block_size, *token_ids[start : start + block_size])
        except struct.error as exc:
            raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
        parent = _hash_packed(parent, packed, salt if block_index == 0 else None)
        hashes.append(parent)
    return hashes


def make_block_hasher(block_size: int, seed: str | bytes) -> Callable[[Request], list[BlockHash]]:
    """A hasher for `Request(block_hasher=...)`.

    Called by the request in __init__ and after every append; returns only the keys of blocks
    that became full since `request.block_hashes` was last extended, so the common call (a
    decode token that does not fill a block) costs one integer division.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    root = root_hash(seed)
    packer = _token_packer(block_size)

    def hash_new_full_blocks(request: Request) -> list[BlockHash]:
        num_full_blocks = len(request.all_token_ids) // block_size
        num_hashed_blocks = len(request.block_hashes)
        if num_full_blocks <= num_hashed_blocks:
            return []
        token_ids = request.all_token_ids
        parent = request.block_hashes[-1] if num_hashed_blocks else root
        salt = _salt_bytes(request.cache_salt)
        new_hashes: list[BlockHash] = []
        for block_index in range(num_hashed_blocks, num_full_blocks):
            start = block_index * block_size
            try:
                packed = packer.pack(block_size, *token_ids[start : start + block_size])
            except struct.error as exc:
                raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
            parent = _hash_packed(parent, packed, salt if block_index == 0 else None)
            new_hashes.append(parent)
        return new_hashes

    return hash_new_full_blocks
