"""float32 CPU linear padded to a multiple of 4 rows: the same values as F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import padded_linear


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 7, 8, 9, 31, 32, 33, 40])
def test_padded_rows_compute_what_f_linear_computes(num_rows: int) -> None:
    torch.manual_seed(num_rows)
    x = torch.randn(num_rows, 96)
    weight = torch.randn(200, 96)
    bias = torch.randn(200)
    y = padded_linear.linear(x, weight, bias)
    assert y.shape == (num_rows, 200) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    # Each real row is what the padded matmul computes for it: the same as with its padding
    # spelled out by hand.
    padded_to = num_rows if num_rows <= 1 or num_rows > 32 else -(-num_rows // 4) * 4
    by_hand = F.linear(torch.cat([x, torch.zeros(padded_to - num_rows, 96)]), weight, bias)[:num_rows]
    assert torch.equal(y, by_hand)


def test_other_dtypes_and_shapes_pass_straight_through() -> None:
    x = torch.randn(7, 32, dtype=torch.bfloat16)
    weight = torch.randn(16, 32, dtype=torch.bfloat16)
    assert torch.equal(padded_linear.linear(x, weight), F.linear(x, weight))
    x3 = torch.randn(2, 7, 32)
    w3 = torch.randn(16, 32)
    assert torch.equal(padded_linear.linear(x3, w3), F.linear(x3, w3))
