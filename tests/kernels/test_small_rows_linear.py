"""float32 CPU linear for few rows (W @ x^T): the values F.linear computes, whichever path a row
count takes, at one thread and at more."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import small_rows_linear


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def num_threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 8, 9, 31, 32, 33, 40])
def test_every_row_count_computes_what_f_linear_computes(num_threads: int, num_rows: int) -> None:
    torch.manual_seed(num_rows)
    x = torch.randn(num_rows, 96)
    weight = torch.randn(200, 96)
    bias = torch.randn(200)
    for b in (bias, None):
        y = small_rows_linear.linear(x, weight, b)
        assert y.shape == (num_rows, 200) and y.is_contiguous() and y.dtype == torch.float32
        torch.testing.assert_close(y, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_each_row_is_its_own_dot_products() -> None:
    """A row's values do not depend on the rows beside it beyond float32 rounding: the same row
    alone, or among others, gives the same result to the last bits' tolerance."""
    torch.manual_seed(0)
    x = torch.randn(6, 64)
    weight = torch.randn(300, 64)
    batched = small_rows_linear.linear(x, weight)
    for row in range(6):
        alone = small_rows_linear.linear(x[row : row + 1], weight)
        torch.testing.assert_close(batched[row : row + 1], alone, rtol=1e-5, atol=1e-5)


def test_a_non_contiguous_input_and_other_dtypes_and_shapes() -> None:
    torch.manual_seed(1)
    x = torch.randn(4, 64)[:, :32]  # rows strided past their length
    weight = torch.randn(16, 32)
    torch.testing.assert_close(small_rows_linear.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    xb = torch.randn(7, 32, dtype=torch.bfloat16)
    assert torch.equal(small_rows_linear.linear(xb, weight.bfloat16()), F.linear(xb, weight.bfloat16()))
    x3 = torch.randn(2, 7, 32)
    assert torch.equal(small_rows_linear.linear(x3, weight), F.linear(x3, weight))
