"""The Triton KV store against the torch reference: plain caches bit for bit, fp8 caches with
their per-vector scales, and negative slots left alone. Interpreter mode without a GPU."""

from __future__ import annotations

import pytest
import torch
from triton_harness import DEVICE

from kernels.kv_store import FP8_E4M3_MAX, fp8_quantize_vectors, store_kv_ref
from kernels.triton_kv_store import store_kv_triton

NUM_BLOCKS, KV_HEADS, BLOCK_SIZE = 6, 3, 4


def _inputs(num_tokens: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    key = (5 * torch.randn(num_tokens, KV_HEADS, head_dim, generator=generator)).to(dtype)
    value = torch.randn(num_tokens, KV_HEADS, head_dim, generator=generator).to(dtype)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=generator)[:num_tokens]
    return key, value, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 24])
def test_plain_cache_matches_reference_exactly(dtype: torch.dtype, head_dim: int) -> None:
    key, value, slots = _inputs(9, head_dim, dtype)
    caches = [torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, head_dim, dtype=dtype) for _ in range(4)]
    store_kv_ref(key, value, caches[0], caches[1], slots)
    on_device = [c.to(DEVICE) for c in caches[2:]]
    store_kv_triton(key.to(DEVICE), value.to(DEVICE), on_device[0], on_device[1], slots.to(DEVICE))
    assert torch.equal(on_device[0].cpu(), caches[0]) and torch.equal(on_device[1].cpu(), caches[1])


def test_fp8_cache_and_scales_match_reference() -> None:
    head_dim = 16
    key, value, slots = _inputs(10, head_dim, torch.float32)
    key[3, 1] = 0.0  # an all-zero vector: scale stays positive, values stay zero
    shape = (NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, head_dim)
    ref = [torch.zeros(shape, dtype=torch.float8_e4m3fn) for _ in range(2)] + [torch.zeros(shape[:3]) for _ in range(2)]
    store_kv_ref(key, value, ref[0], ref[1], slots, ref[2], ref[3])
    out = [t.clone().to(DEVICE) for t in ref]
    for t in out:
        t.zero_() if t.dtype == torch.float32 else t.view(torch.uint8).zero_()
    store_kv_triton(key.to(DEVICE), value.to(DEVICE), out[0], out[1], slots.to(DEVICE), out[2], out[3])
    torch.testing.assert_close(out[2].cpu(), ref[2], rtol=1e-6, atol=0)
    torch.testing.assert_close(out[3].cpu(), ref[3], rtol=1e-6, atol=0)
    # The fp8 codes: equal, or one step apart where x / scale lands on a tie after rounding
    # differences in the scale's last bit.
    for got, want in ((out[0], ref[0]), (out[1], ref[1])):
        steps_apart = (got.cpu().view(torch.uint8).int() - want.view(torch.uint8).int()).abs()
        assert steps_apart.max() <= 1 and (steps_apart == 0).float().mean() > 0.98
    # And the cache dequantizes to the stored vectors within e4m3's half step (2^-4 relative).
    blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    restored = out[0].cpu()[blocks, :, offsets].float() * out[2].cpu()[blocks, :, offsets].unsqueeze(-1)
    torch.testing.assert_close(restored, key, rtol=0.0625, atol=1e-6)
    assert restored[3, 1].abs().max() == 0


def test_fp8_scale_is_amax_over_448() -> None:
    x = torch.tensor([[[1.0, -896.0, 3.0, 0.5]]])
    q, scale = fp8_quantize_vectors(x)
    assert scale.item() == pytest.approx(896.0 / FP8_E4M3_MAX)
    assert q.float()[0, 0, 1].item() == -FP8_E4M3_MAX


def test_negative_slots_are_skipped() -> None:
    head_dim = 16
    key, value, slots = _inputs(5, head_dim, torch.float32)
    slots[2] = -1
    k_cache = torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, head_dim, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    store_kv_triton(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))
    expected_k = torch.zeros_like(k_cache, device="cpu")
    expected_v = torch.zeros_like(expected_k)
    keep = slots >= 0
    store_kv_ref(key[keep], value[keep], expected_k, expected_v, slots[keep])
    assert torch.equal(k_cache.cpu(), expected_k) and torch.equal(v_cache.cpu(), expected_v)
