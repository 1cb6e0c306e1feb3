"""The quantization formats of kernels/quant_ref.py: exact round trips for weights already on a
format's grid, error bounds for arbitrary weights, nibble packing, and the fp8 KV reference
attention against attention over the dequantized cache."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_store import fp8_quantize_vectors, store_kv_ref
from kernels.paged_attention import paged_attention_ref
from kernels.quant_ref import (
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    int4_group_size_for,
    int4_linear_ref,
    int8_linear_ref,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)


def _weight(n: int = 24, k: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def test_pack_unpack_int4_are_inverse_and_low_nibble_first() -> None:
    q = torch.randint(0, 16, (5, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = pack_int4(q)
    assert packed.shape == (5, 6) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    assert packed[0, 0].item() == q[0, 0].item() | (q[0, 1].item() << 4)


def test_int8_error_is_at_most_half_a_step() -> None:
    weight = _weight()
    q, scales = quantize_int8(weight)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    error = (dequantize_int8(q, scales) - weight).abs()
    assert (error <= scales[:, None] / 2 + 1e-7).all()
    # The largest weight of each row lands exactly on +-127 steps.
    assert torch.equal(q.abs().amax(dim=1), torch.full((weight.shape[0],), 127, dtype=torch.int8))


def test_int8_round_trip_is_exact_on_its_grid() -> None:
    scales = torch.rand(8) + 0.1
    q = torch.randint(-127, 128, (8, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    q[:, 0] = 127  # so amax / 127 recovers the scale
    weight = q.float() * scales[:, None]
    q2, scales2 = quantize_int8(weight)
    assert torch.equal(q2, q)
    torch.testing.assert_close(scales2, scales)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_error_is_at_most_half_a_step(group_size: int) -> None:
    weight = _weight(k=256)
    qweight, scales, zeros = quantize_int4(weight, group_size)
    assert qweight.shape == (24, 128) and scales.shape == zeros.shape == (24, 256 // group_size)
    restored = dequantize_int4(qweight, scales, zeros, group_size)
    step = scales.repeat_interleave(group_size, dim=1)
    assert ((restored - weight).abs() <= step / 2 + 1e-6).all()


def test_int4_round_trip_is_exact_for_blocks_on_a_grid() -> None:
    # Like a GGUF Q4_1 block: 16 levels d * q + m per group, with 0 and 15 both used.
    generator = torch.Generator().manual_seed(2)
    q = torch.randint(0, 16, (4, 64), generator=generator)
    q[:, ::32] = 0
    q[:, 1::32] = 15
    d = (torch.rand(4, 2, generator=generator) + 0.5).repeat_interleave(32, dim=1)
    m = (torch.randn(4, 2, generator=generator)).repeat_interleave(32, dim=1)
    weight = q.float() * d + m
    qweight, scales, zeros = quantize_int4(weight, 32)
    torch.testing.assert_close(dequantize_int4(qweight, scales, zeros, 32), weight, atol=1e-5, rtol=0)


def test_int4_group_size_for_divides_the_input() -> None:
    assert int4_group_size_for(4096) == 128
    assert int4_group_size_for(576) == 64  # SmolLM2's hidden size
    assert int4_group_size_for(576, 32) == 32
    with pytest.raises(ValueError, match="group size"):
        int4_group_size_for(100)


def test_fp8_relative_error_within_half_a_step() -> None:
    weight = _weight()
    q, scales = quantize_fp8(weight)
    assert q.dtype == torch.float8_e4m3fn
    restored = dequantize_fp8(q, scales)
    # e4m3: 3 mantissa bits, half a step is 2^-4 relative (normal range), absolute below it.
    assert ((restored - weight).abs() <= weight.abs() * 2**-4 + scales[:, None] * 2**-9).all()


def test_linear_references_are_f_linear_on_dequantized_weights() -> None:
    weight, x, bias = _weight(), torch.randn(3, 128), torch.randn(24)
    q, scales = quantize_int8(weight)
    torch.testing.assert_close(int8_linear_ref(x, q, scales, bias), x @ dequantize_int8(q, scales).T + bias)
    qweight, s4, z4 = quantize_int4(weight, 64)
    torch.testing.assert_close(int4_linear_ref(x, qweight, s4, z4, 64),
                               x @ dequantize_int4(qweight, s4, z4, 64).T)


def test_fp8_kv_reference_attends_over_dequantized_values() -> None:
    """store_kv_ref into an fp8 cache, then paged_attention_ref reading it, equals the fp32
    reference over a cache holding exactly the dequantized vectors (decode and prefill rows)."""
    generator = torch.Generator().manual_seed(3)
    num_blocks, kv_heads, block_size, head_dim, heads = 8, 2, 4, 16, 4
    seq_lens, query_lens = [11, 6], [1, 6]
    key = torch.randn(sum(seq_lens), kv_heads, head_dim, generator=generator)
    value = torch.randn(sum(seq_lens), kv_heads, head_dim, generator=generator)
    block_table = torch.tensor([[5, 1, 7], [2, 0, 0]], dtype=torch.int32)
    slots = torch.tensor([int(block_table[0, p // 4]) * 4 + p % 4 for p in range(11)]
                         + [int(block_table[1, p // 4]) * 4 + p % 4 for p in range(6)])
    shape = (num_blocks, kv_heads, block_size, head_dim)
    k8, v8 = torch.zeros(shape, dtype=torch.float8_e4m3fn), torch.zeros(shape, dtype=torch.float8_e4m3fn)
    k_scale, v_scale = torch.zeros(shape[:3]), torch.zeros(shape[:3])
    store_kv_ref(key, value, k8, v8, slots, k_scale, v_scale)
    kq, ks = fp8_quantize_vectors(key)
    vq, vs = fp8_quantize_vectors(value)
    k32, v32 = torch.zeros(shape), torch.zeros(shape)
    store_kv_ref(kq.float() * ks.unsqueeze(-1), vq.float() * vs.unsqueeze(-1), k32, v32, slots)
    query = torch.randn(7, heads, head_dim, generator=generator)
    args = (block_table, [0, 1, 7], seq_lens, head_dim ** -0.5)
    out8 = paged_attention_ref(query, k8, v8, *args, k_scale=k_scale, v_scale=v_scale)
    out32 = paged_attention_ref(query, k32, v32, *args)
    torch.testing.assert_close(out8, out32, atol=1e-5, rtol=1e-5)
    # And the fp8 error itself stays small against the unquantized cache.
    k_plain, v_plain = torch.zeros(shape), torch.zeros(shape)
    store_kv_ref(key, value, k_plain, v_plain, slots)
    plain = paged_attention_ref(query, k_plain, v_plain, *args)
    assert (out8 - plain).abs().max() < 0.1
