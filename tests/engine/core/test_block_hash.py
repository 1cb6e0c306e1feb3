from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_hash import hash_block_tokens, hash_token_blocks, make_block_hasher, root_hash
from engine.request import Request
from engine.sampling_params import SamplingParams


def _reference_key(parent: bytes, token_ids: list[int], extra: bytes | None) -> bytes:
    # The documented layout, written out independently of the module.
    data = parent + len(token_ids).to_bytes(4, "little") + b"".join(t.to_bytes(4, "little") for t in token_ids)
    if extra is not None:
        data += b"\x01" + extra
    return hashlib.sha256(data).digest()


def test_root_hash_layout_and_seed_separation() -> None:
    assert root_hash("smollm2") == hashlib.sha256(b"draftgate-prefix-cache-v1\x00smollm2").digest()
    assert root_hash("smollm2") == root_hash(b"smollm2")
    assert root_hash("a") != root_hash("b")


def test_hash_block_tokens_matches_the_documented_layout() -> None:
    parent = root_hash("m")
    assert hash_block_tokens(parent, [1, 2, 70000, 4], None) == _reference_key(parent, [1, 2, 70000, 4], None)
    assert hash_block_tokens(parent, [1, 2], b"salt") == _reference_key(parent, [1, 2], b"salt")
    # "No extra" and "empty extra" are different keys.
    assert hash_block_tokens(parent, [1, 2], b"") != hash_block_tokens(parent, [1, 2], None)


def test_chain_keys_cover_the_whole_prefix() -> None:
    tokens = list(range(10))
    keys = hash_token_blocks(tokens, 4, "m")
    assert len(keys) == 2  # the partial third block has no key
    assert keys[0] == _reference_key(root_hash("m"), [0, 1, 2, 3], None)
    assert keys[1] == _reference_key(keys[0], [4, 5, 6, 7], None)
    changed_first = hash_token_blocks([99] + tokens[1:], 4, "m")
    assert changed_first[0] != keys[0] and changed_first[1] != keys[1]  # block 1 is equal, its key is not
    changed_partial = hash_token_blocks(tokens[:8] + [55, 56], 4, "m")
    assert changed_partial == keys


def test_seed_and_salt_change_every_key() -> None:
    tokens = list(range(12))
    plain = hash_token_blocks(tokens, 4, "m")
    other_model = hash_token_blocks(tokens, 4, "other")
    salted = hash_token_blocks(tokens, 4, "m", cache_salt="tenant-a")
    other_salt = hash_token_blocks(tokens, 4, "m", cache_salt="tenant-b")
    for keys in (other_model, salted, other_salt):
        assert all(a != b for a, b in zip(plain, keys, strict=True))
    assert all(a != b for a, b in zip(salted, other_salt, strict=True))
    assert salted[0] == _reference_key(root_hash("m"), [0, 1, 2, 3], b"tenant-a")
    assert salted[1] == _reference_key(salted[0], [4, 5, 6, 7], None)  # salt only in the first block


def test_bad_token_ids_raise_value_error() -> None:
    with pytest.raises(ValueError, match="token ids"):
        hash_token_blocks([1, -2, 3, 4], 4, "m")
    with pytest.raises(ValueError, match="token ids"):
        hash_block_tokens(root_hash("m"), [2**32], None)
    with pytest.raises(ValueError, match="block_size"):
        hash_token_blocks([1], 0, "m")


def test_request_hasher_returns_only_new_full_blocks() -> None:
    hasher = make_block_hasher(4, "m")
    request = Request("r", [1, 2, 3], SamplingParams(), block_hasher=hasher, cache_salt="s")
    assert request.block_hashes == []
    request.append_output_token_ids(4)
    assert request.block_hashes == hash_token_blocks([1, 2, 3, 4], 4, "m", cache_salt="s")
    assert hasher(request) == []  # nothing new since the last extension
    request.append_output_token_ids([5, 6, 7, 8, 9])
    assert request.block_hashes == hash_token_blocks(list(range(1, 10)), 4, "m", cache_salt="s")


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 50_000), min_size=1, max_size=40),
    appends=st.lists(st.lists(st.integers(0, 50_000), min_size=1, max_size=6), max_size=8),
    block_size=st.sampled_from([1, 2, 4, 16]),
    salt=st.none() | st.text(max_size=5),
)
def test_incremental_hashes_equal_the_batch_function(
    prompt: list[int], appends: list[list[int]], block_size: int, salt: str | None
) -> None:
    request = Request("r", prompt, SamplingParams(), cache_salt=salt, block_hasher=make_block_hasher(block_size, "m"))
    for token_ids in appends:
        request.append_output_token_ids(token_ids)
    assert request.block_hashes == hash_token_blocks(request.all_token_ids, block_size, "m", cache_salt=salt)


def test_token_packing_is_little_endian_uint32() -> None:
    # Guard the cross-process contract: the gateway and the engine must pack identically.
    assert struct.calcsize("<I") == 4
    parent = b"\x00" * 32
    expected = hashlib.sha256(parent + b"\x01\x00\x00\x00" + b"\x01\x02\x03\x04").digest()
    assert hash_block_tokens(parent, [0x04030201], None) == expected
