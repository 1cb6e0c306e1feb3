"""Linear layers whose weights come from a checkpoint, including fused projections.

A fused projection (q/k/v, gate/up) is one matmul over a weight that stacks several
checkpoint tensors along the output dimension; `output_sizes` records where each one starts,
so the loader copies every checkpoint tensor straight into its rows.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import small_rows_linear


class Linear(nn.Module):
    """y = x W^T (+ b). Parameters are allocated uninitialized: the loader fills every row,
    and skipping nn.Linear's random init saves a full pass over a large model's weights."""

    def __init__(self, input_size: int, output_sizes: list[int], *, bias: bool,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(output_sizes)
        self.weight = nn.Parameter(torch.empty(self.output_size, input_size, dtype=dtype, device=device),
                                   requires_grad=False)  # [output_size, input_size]
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size, dtype=dtype, device=device),
                                     requires_grad=False)  # [output_size]

    def shard_rows(self, shard: int) -> slice:
        """Rows of the fused weight that hold checkpoint tensor number `shard`."""
        start = sum(self.output_sizes[:shard])
        return slice(start, start + self.output_sizes[shard])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, input_size] -> [num_tokens, output_size]
        return small_rows_linear.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_sizes}, bias={self.bias is not None}"
