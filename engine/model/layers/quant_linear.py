"""Execution forms of a linear layer, swapped in after loading (engine/model/quantization.py).

Each is built from a loaded `Linear` (or the lm_head's weight) and computes the same y = x W^T + b
through a faster kernel: a oneDNN-prepacked float32 or bf16 weight on CPU, or a weight-only
quantized one (int8 per channel, int4 group-wise, fp8 per channel) through kernels.quant_matmul,
which picks Triton on CUDA and torch's packed CPU kernels on CPU. They keep Linear's shape
attributes (input_size, output_sizes, output_size) and drop the full-precision weight, which is
the point.

float_output=True makes a layer return float32, as the lm_head does (LMHead's contract).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import panel_linear, small_rows_linear
from kernels.onednn_linear import prepack
from kernels.quant_matmul import (
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    fp8_linear,
    int4_linear,
    int8_linear,
    prepare_fp8,
    prepare_int4,
    prepare_int8,
)
from kernels.quant_ref import int4_group_size_for, quantize_fp8, quantize_int4, quantize_int8


class _ExecutionLinear(nn.Module):
    """Shape bookkeeping shared by the execution forms."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: torch.Tensor | None,
                 float_output: bool) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(output_sizes)
        self.float_output = float_output
        # [output_size]; a buffer so that it follows the module, None without a bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)

    def _finish(self, y: torch.Tensor) -> torch.Tensor:  # [num_tokens, output_size]
        return y.float() if self.float_output else y

    def _stored(self) -> list[torch.Tensor]:
        stored = getattr(self, "weight_q", None)
        return [t for t in vars(stored).values() if isinstance(t, torch.Tensor)] if stored is not None else []

    def stored_bytes(self) -> int:
        """Bytes a forward reads for the weight (and bias): what bandwidth estimates count."""
        tensors = self._stored() + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_sizes}, bias={self.bias is not None}"


class PackedLinear(_ExecutionLinear):
    """An unquantized float32 or bf16 weight for oneDNN (CPU only; see kernels/onednn_linear.py).

    Where the compiled CPU kernels take float32 products (kernels/small_rows_linear.py's
    skinny_enabled: AVX2 CPUs), a weight whose N is a multiple of 16 is held once, in panels
    (kernels/panel_linear.py), and every row count takes that kernel: decoding, verification and
    prefill chunks alike, with bit-identical rows whatever the batch. Another float32 weight keeps
    its plain [N, K] form for the few-row kernel, and more rows call oneDNN with that same plain
    weight, which it reorders per call (within 5% of a prepacked one at 17-512 rows for the
    decoder's shapes on the AVX2 EPYC); `prepack_too` keeps a prepacked copy as well there, for an
    lm_head (about 20% faster at 17-128 rows). Elsewhere (bf16, AVX512 CPUs) the weight is only
    prepacked, as before."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, output_sizes: list[int] | None = None,
                 *, float_output: bool = False, prepack_too: bool = False) -> None:
        # weight: [N, K] float32 or bfloat16 on CPU
        super().__init__(weight.shape[1], output_sizes or [weight.shape[0]], bias, float_output)
        self.panels: torch.Tensor | None = None  # [N / 16, K, 16], for the panel kernel
        self.plain_weight: torch.Tensor | None = None  # [N, K] contiguous, for the few-row kernel
        if weight.dtype == torch.float32 and small_rows_linear.skinny_enabled():
            if panel_linear.can_pack(weight):
                self.panels = panel_linear.pack_panels(weight)
            else:
                self.plain_weight = weight.detach().contiguous()
        # An opaque oneDNN tensor: kept as a plain attribute, not a buffer (it has no storage
        # that state_dict or .to() could handle).
        unpacked = self.panels is None and self.plain_weight is None
        self.packed = prepack(weight) if unpacked or (prepack_too and self.plain_weight is not None) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, K] -> [num_tokens, N]
        if self.panels is not None:
            return self._finish(panel_linear.panel_linear(x, self.panels, self.bias))
        onednn_weight = self.packed if self.packed is not None else self.plain_weight
        return self._finish(small_rows_linear.linear(x, self.plain_weight, self.bias, onednn_weight=onednn_weight))

    def _stored(self) -> list[torch.Tensor]:  # what one forward reads: one of the forms
        if self.panels is not None:
            return [self.panels]
        return [self.packed if self.packed is not None else self.plain_weight]


class Bf16WeightLinear(_ExecutionLinear):
    """float32 arithmetic over a weight held in bf16: half the bytes a forward reads, for a draft
    whose few-row passes are bound by reading its weights (engine/worker/model_runner.py's
    draft_weight_format). Few rows take the compiled kernel, which widens the weight exactly as
    it reads it (kernels/small_rows_linear.py); more rows (prefill chunks) widen it for the call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, output_sizes: list[int] | None = None,
                 *, float_output: bool = False) -> None:  # weight: [N, K] float32 or bf16
        super().__init__(weight.shape[1], output_sizes or [weight.shape[0]], bias, float_output)
        if self.bias is not None:
            self.bias = self.bias.float()
        self.weight_bf16 = weight.detach().to(torch.bfloat16).contiguous()  # [N, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, K] float32 -> [num_tokens, N] float32
        return self._finish(small_rows_linear.linear(x, self.weight_bf16, self.bias))

    def _stored(self) -> list[torch.Tensor]:
        return [self.weight_bf16]


class Int8WeightLinear(_ExecutionLinear):
    """float32 arithmetic over a weight held in int8, one float32 scale per output row: a quarter
    of float32's bytes, half of Bf16WeightLinear's, for a draft whose few-row passes are bound by
    reading its weights (engine/worker/model_runner.py's draft_weight_format). Few rows take the
    compiled kernel (kernels/small_rows_linear.py's linear_int8); more rows dequantize for the
    call. Unlike Bf16WeightLinear it rounds the weights (to 127 steps of each row's largest
    magnitude): a draft's proposals may move a little, never the target's output."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, output_sizes: list[int] | None = None,
                 *, float_output: bool = False) -> None:  # weight: [N, K] float32 or bf16
        super().__init__(weight.shape[1], output_sizes or [weight.shape[0]], bias, float_output)
        if self.bias is not None:
            self.bias = self.bias.float()
        q, scales = quantize_int8(weight.detach())
        self.weight_int8 = q.contiguous()  # [N, K] int8
        self.scales = scales.float().contiguous()  # [N] float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, K] float32 -> [num_tokens, N] float32
        return self._finish(small_rows_linear.linear_int8(x, self.weight_int8, self.scales, self.bias))

    def _stored(self) -> list[torch.Tensor]:
        return [self.weight_int8, self.scales]


class Int8Linear(_ExecutionLinear):
    """Weight-only int8, one scale per output channel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, output_sizes: list[int] | None = None,
                 *, float_output: bool = False) -> None:  # weight: [N, K]
        super().__init__(weight.shape[1], output_sizes or [weight.shape[0]], bias, float_output)
        q, scales = quantize_int8(weight)
        self.weight_q: Int8Weight = prepare_int8(q, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._finish(int8_linear(x, self.weight_q, self.bias))


class Int4Linear(_ExecutionLinear):
    """Weight-only int4, asymmetric per group of `group_size` input channels."""

    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None, output_sizes: list[int] | None = None,
                 *, group_size: int = 128, float_output: bool = False,
                 quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 input_size: int | None = None) -> None:
        """Either `weight` ([N, K] float, quantized here with the largest group size <=
        group_size dividing K) or `quantized` = (qweight [N, K//2] uint8, scales [N, G],
        zeros [N, G]) already in kernels.quant_ref's format (GPTQ/AWQ checkpoints) with
        input_size and the exact group_size."""
        if quantized is None:
            assert weight is not None
            input_size = weight.shape[1]
            group_size = int4_group_size_for(input_size, group_size)
            quantized = quantize_int4(weight, group_size)
        qweight, scales, zeros = quantized
        assert input_size is not None
        super().__init__(input_size, output_sizes or [qweight.shape[0]], bias, float_output)
        self.group_size = group_size
        self.weight_q: Int4Weight = prepare_int4(qweight, scales, zeros, group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._finish(int4_linear(x, self.weight_q, self.bias))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}"


class Fp8Linear(_ExecutionLinear):
    """Weight-only fp8 (e4m3), one scale per output channel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, output_sizes: list[int] | None = None,
                 *, float_output: bool = False) -> None:  # weight: [N, K]
        super().__init__(weight.shape[1], output_sizes or [weight.shape[0]], bias, float_output)
        q, scales = quantize_fp8(weight)
        self.weight_q: Fp8Weight = prepare_fp8(q, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._finish(fp8_linear(x, self.weight_q, self.bias))
