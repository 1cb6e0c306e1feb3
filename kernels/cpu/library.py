"""Tensor-level entry points of the compiled CPU kernels (ctypes over the library's C ABI).

The C functions take raw pointers, strides and sizes; this module checks what C cannot
(devices, dtypes, layouts), passes each tensor's address and turns the library's error codes
into ValueError. ctypes releases the GIL for the duration of every call.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
_WEIGHT_CODES = {**_DTYPE_CODES, torch.int8: 2}  # decoder_layers' linear weights (skinny_entry.h's WeightCode)
_PANELS_CODE = 3  # a float32 weight in panels, [N / 16, K, 16] (kernels/panel_linear.py)
PANEL_WIDTH = 16  # output channels a panel holds (panel_linear.cpp's kPanelWidth)
_ERROR_LEN = 512

_i32, _i64, _ptr, _f64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_ATTENTION_ARGS = [
    _ptr, _i32, _i64, _i64,  # query, dtype, token stride, head stride
    _ptr, _ptr, _i32, _ptr,  # k_cache, v_cache, cache dtype, out
    _ptr, _i64, _i64,  # block_table, row stride, max blocks per request
    _ptr, _ptr, _i64, _i64,  # query_start_loc, seq_lens, num_reqs, num_tokens
    _i64, _i64, _i64, _i64, _i64,  # num_heads, num_kv_heads, head_dim, num_blocks, block_size
    _f64, _i64, _i32,  # scale, sliding_window (0: none), num_threads
    ctypes.c_char_p, _i64,  # error buffer, its length
]
_STORE_ARGS = [
    _ptr, _i32, _i64, _i64,  # key, dtype, token stride, head stride
    _ptr, _i32, _i64, _i64,  # value, dtype, token stride, head stride
    _ptr, _ptr, _i32,  # k_cache, v_cache, cache dtype
    _ptr, _i64, _i64, _i64, _i64, _i64,  # slot_mapping, num_tokens, num_kv_heads, head_dim, num_blocks, block_size
    ctypes.c_char_p, _i64,  # error buffer, its length
]
_RMS_NORM_ARGS = [
    _ptr, _i64, _ptr, _i64,  # x, its row stride, residual (or null), its row stride
    _ptr, _ptr, _ptr, _i32,  # weight, out, residual_out (or null), dtype
    _i64, _i64, _f64, _i32,  # rows, hidden, eps, num_threads
    ctypes.c_char_p, _i64,  # error buffer, its length
]
_SILU_MUL_ARGS = [
    _ptr, _i64, _ptr, _i32,  # gate_up, its row stride, out, dtype
    _i64, _i64, _i32,  # rows, d, num_threads
    ctypes.c_char_p, _i64,  # error buffer, its length
]
_SKINNY_LINEAR_ARGS = [
    _ptr, _i64, _ptr, _ptr, _ptr,  # x, its row stride, weight, bias (or null), out
    _i64, _i64, _i64, _i32,  # rows, out features, in features, num_threads
    ctypes.c_char_p, _i64,  # error buffer, its length
]
_SKINNY_LINEAR_INT8_ARGS = [
    _ptr, _i64, _ptr, _ptr, _ptr, _ptr,  # x, its row stride, weight, scales, bias (or null), out
    _i64, _i64, _i64, _i32,  # rows, out features, in features, num_threads
    ctypes.c_char_p, _i64,  # error buffer, its length
]
_DECODER_LAYERS_ARGS = [
    _ptr, _i64, _ptr, _ptr,  # layers (DecoderLayerWeights[]), their number, final norm, hidden in
    _ptr, _ptr, _ptr, _i64, _i64,  # cos_sin, slot_mapping, block_table, its row stride, max blocks per request
    _ptr, _ptr, _i64, _i64,  # query_start_loc, seq_lens, num_reqs, num_tokens
    _i64, _i64, _i64, _i64, _i64,  # hidden, num_heads, num_kv_heads, head_dim, intermediate
    _i64, _i64, _f64, _f64, _i32,  # num_blocks, block_size, scale, eps, num_threads
    _ptr, ctypes.c_char_p, _i64,  # out, error buffer, its length
]


_EAGLE_FORWARD_ARGS = [
    _ptr, _ptr, _i64, _ptr, _i64,  # token ids, embedding, vocab size, states, their row stride
    _ptr, _i64, _ptr, _ptr, _ptr,  # fc weight, its dtype code, its scales, the layer (DecoderLayerWeights), final norm
    _ptr, _i64, _ptr,  # the rotary table, its rows, positions
] + _DECODER_LAYERS_ARGS[5:]  # decoder_layers' from slot_mapping on
_DRAFT_TOP1_ARGS = [
    _ptr, _i64, _i64, _ptr, _i64, _ptr,  # x, rows, hidden, weight, its dtype code, its scales
    _i64, _ptr, _i32, _ptr, _ptr,  # vocabulary rows, their target ids, num_threads, tokens out, probs out
    ctypes.c_char_p, _i64,  # error buffer, its length
]


class DecoderLayerWeights(ctypes.Structure):
    """One decoder layer's tensors for decoder_layers (kernels/cpu/decoder_layers.cpp's struct of
    the same name; every field 8 bytes). Addresses only: the caller keeps the tensors alive."""

    _fields_ = [
        ("input_norm", _ptr), ("post_norm", _ptr),
        ("qkv", _ptr), ("qkv_bias", _ptr), ("qkv_dtype", _i64),
        ("o", _ptr), ("o_bias", _ptr), ("o_dtype", _i64),
        ("gate_up", _ptr), ("gate_up_bias", _ptr), ("gate_up_dtype", _i64),
        ("down", _ptr), ("down_bias", _ptr), ("down_dtype", _i64),
        ("k_cache", _ptr), ("v_cache", _ptr), ("sliding_window", _i64),
        ("qkv_scales", _ptr), ("o_scales", _ptr), ("gate_up_scales", _ptr), ("down_scales", _ptr),
    ]


@dataclass(frozen=True)
class DecoderLayerTensors:
    """What decoder_layers reads of one layer. Linear weights [N, K] contiguous, float32, bf16
    (widened exactly as read) or int8 with their float32 scales [N] (the *_scales fields, None
    for the other dtypes), or float32 in panels [N / 16, K, 16] (kernels/panel_linear.py);
    biases float32 or None; norms float32 [hidden]; the caches float32 [num_blocks,
    num_kv_heads, block_size, head_dim], contiguous."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor  # [num_heads * head_dim + 2 * num_kv_heads * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [hidden, num_heads * head_dim]
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [hidden, intermediate]
    down_bias: torch.Tensor | None
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    sliding_window: int | None
    qkv_scales: torch.Tensor | None = None
    o_scales: torch.Tensor | None = None
    gate_up_scales: torch.Tensor | None = None
    down_scales: torch.Tensor | None = None


@dataclass(frozen=True)
class DecoderStack:
    """A decoder stack as the one-call kernels take it, besides a step's rows: the layers' C
    array (decoder_layer_weights, their KV caches included), the final norm and the shapes."""

    layers: ctypes.Array
    final_norm: torch.Tensor  # [hidden] float32
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    num_blocks: int  # of the KV caches
    block_size: int
    scale: float
    eps: float


@dataclass(frozen=True)
class CpuAttentionPlan:
    """What the compiled kernel needs of a step's shape, converted once and shared by every
    layer (the compiled kernel plans its own work items per call, in microseconds)."""

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on the CPU
    seq_lens: torch.Tensor  # [num_reqs] int32, on the CPU
    sliding_window: int | None


class CpuKernels:
    """The loaded library. Every method expects CPU tensors that `supports_*` accepted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        self._local = threading.local()
        self._attention = self._bind("draftgate_paged_attention", _ATTENTION_ARGS)
        self._store = self._bind("draftgate_store_kv", _STORE_ARGS)
        self._rms_norm = self._bind("draftgate_rms_norm", _RMS_NORM_ARGS)
        self._silu_mul = self._bind("draftgate_silu_mul", _SILU_MUL_ARGS)
        self._skinny_linear = {
            torch.float32: self._bind("draftgate_skinny_linear", _SKINNY_LINEAR_ARGS),
            torch.bfloat16: self._bind("draftgate_skinny_linear_bf16", _SKINNY_LINEAR_ARGS),
            torch.int8: self._bind("draftgate_skinny_linear_int8", _SKINNY_LINEAR_INT8_ARGS),
        }
        self._panel_linear = self._bind("draftgate_panel_linear", _SKINNY_LINEAR_ARGS)
        self._decoder_layers = self._bind("draftgate_decoder_layers", _DECODER_LAYERS_ARGS)
        self._eagle_forward = self._bind("draftgate_eagle_forward", _EAGLE_FORWARD_ARGS)
        self._draft_top1 = self._bind("draftgate_draft_top1", _DRAFT_TOP1_ARGS)

    def _error_buffer(self) -> ctypes.Array:
        """This thread's buffer for a kernel's error message. One per thread (ctypes releases the
        GIL during a call), made once: a new buffer per call cost ~1 us of every kernel call, and a
        decode step makes ~270 of them (30 layers x 9 on the embedded model)."""
        buffer = getattr(self._local, "error", None)
        if buffer is None:
            buffer = self._local.error = ctypes.create_string_buffer(_ERROR_LEN)
        return buffer

    def _bind(self, symbol: str, argtypes: list) -> ctypes._CFuncPtr:
        """A C function of the library; every one returns an int status (0: success)."""
        function = getattr(self._lib, symbol)  # AttributeError when the library lacks it
        function.argtypes = argtypes
        function.restype = ctypes.c_int
        return function

    # ---- what the compiled path handles (the dispatcher uses the reference otherwise) ----
    # These run on every kernel call (~270 a decode step): Tensor.is_cpu rather than building a
    # device object to compare its name, and plain loops rather than generators.
    @staticmethod
    def supports_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
        return (query.is_cpu and query.dtype in _DTYPE_CODES and k_cache.dtype in _DTYPE_CODES
                and v_cache.dtype == k_cache.dtype and k_cache.is_contiguous() and v_cache.is_contiguous()
                and k_cache.is_cpu and v_cache.is_cpu)

    @staticmethod
    def supports_store(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
        # The caches are written in place, so they must be the real (contiguous) storage.
        return CpuKernels.supports_attention(key, k_cache, v_cache) and value.dtype in _DTYPE_CODES and value.is_cpu

    @staticmethod
    def supports_rows(*tensors: torch.Tensor) -> bool:
        """Row-wise kernels (rms_norm, silu_mul): CPU tensors of one dtype, 2-D with unit
        column stride."""
        dtype = tensors[0].dtype
        if dtype not in _DTYPE_CODES:
            return False
        for t in tensors:
            if not (t.is_cpu and t.dtype == dtype and t.dim() == 2 and t.stride(1) == 1):
                return False
        return True

    def supports_skinny_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                               scales: torch.Tensor | None = None) -> bool:
        """float32 CPU tensors, x 2-D with unit column stride, the weight contiguous (float32, bf16
        widened as it is read, or int8 with its float32 scales per row)."""
        return self._skinny_kernel_for(x, weight, bias, scales) is not None

    def _skinny_kernel_for(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           scales: torch.Tensor | None = None) -> ctypes._CFuncPtr | None:
        """The few-row kernel for the weight's dtype where it takes these tensors, else None."""
        kernel = self._skinny_linear.get(weight.dtype)
        if (kernel is None or x.dtype is not torch.float32 or x.dim() != 2 or x.stride(1) != 1 or not x.is_cpu
                or not weight.is_cpu or not weight.is_contiguous()
                or (bias is not None and (bias.dtype is not torch.float32 or not bias.is_cpu))):
            return None
        if (weight.dtype is torch.int8) != (scales is not None):
            return None  # int8 weights come with their scales, and only they do
        if scales is not None and (scales.dtype is not torch.float32 or not scales.is_cpu
                                   or not scales.is_contiguous() or scales.shape != (weight.shape[0],)):
            return None
        return kernel

    def plan(self, query_start_loc: list[int], seq_lens: list[int], sliding_window: int | None) -> CpuAttentionPlan:
        return CpuAttentionPlan(torch.tensor(query_start_loc, dtype=torch.int32),
                                torch.tensor(seq_lens, dtype=torch.int32), sliding_window)

    def paged_attention(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
        block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
        query_start_loc: list[int],
        seq_lens: list[int],
        scale: float,
        sliding_window: int | None = None,
        plan: CpuAttentionPlan | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query's dtype
        """Same contract as kernels.paged_attention.paged_attention_ref."""
        if plan is None or plan.sliding_window != sliding_window:
            plan = self.plan(query_start_loc, seq_lens, sliding_window)
        num_tokens, num_heads, head_dim = query.shape
        num_blocks, num_kv_heads, block_size, cache_head_dim = k_cache.shape
        if cache_head_dim != head_dim or v_cache.shape != k_cache.shape:
            raise ValueError(f"query head_dim {head_dim} and caches {tuple(k_cache.shape)}, "
                             f"{tuple(v_cache.shape)} do not match")
        num_reqs = plan.seq_lens.shape[0]
        if plan.query_start_loc.shape[0] != num_reqs + 1 or block_table.shape[0] < num_reqs:
            raise ValueError(f"query_start_loc needs {num_reqs + 1} entries and block_table {num_reqs} rows")
        if query.stride(2) != 1:
            query = query.contiguous()
        if block_table.dtype != torch.int32 or block_table.stride(1) != 1 or block_table.device.type != "cpu":
            block_table = block_table.to(device="cpu", dtype=torch.int32).contiguous()
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=query.dtype)
        error = self._error_buffer()
        status = self._attention(
            query.data_ptr(), _DTYPE_CODES[query.dtype], query.stride(0), query.stride(1),
            k_cache.data_ptr(), v_cache.data_ptr(), _DTYPE_CODES[k_cache.dtype], out.data_ptr(),
            block_table.data_ptr(), block_table.stride(0), block_table.shape[1],
            plan.query_start_loc.data_ptr(), plan.seq_lens.data_ptr(), num_reqs, num_tokens,
            num_heads, num_kv_heads, head_dim, num_blocks, block_size,
            scale, sliding_window or 0, torch.get_num_threads(), error, _ERROR_LEN,
        )
        if status != 0:
            raise ValueError(f"paged_attention: {error.value.decode()}")
        return out

    def store_kv(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
        slot_mapping: torch.Tensor,  # [num_tokens] int64
    ) -> None:
        """Same contract as kernels.kv_store.store_kv_ref; an out-of-range slot raises ValueError."""
        num_blocks, num_kv_heads, block_size, head_dim = k_cache.shape
        num_tokens = key.shape[0]
        if key.shape != (num_tokens, num_kv_heads, head_dim) or value.shape != key.shape:
            raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must be "
                             f"[{num_tokens}, {num_kv_heads}, {head_dim}] for a cache of {tuple(k_cache.shape)}")
        if slot_mapping.shape != (num_tokens,):
            raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must have one entry per token ({num_tokens})")
        key = key if key.stride(2) == 1 else key.contiguous()
        value = value if value.stride(2) == 1 else value.contiguous()
        slot_mapping = slot_mapping.to(device="cpu", dtype=torch.int64).contiguous()
        error = self._error_buffer()
        status = self._store(
            key.data_ptr(), _DTYPE_CODES[key.dtype], key.stride(0), key.stride(1),
            value.data_ptr(), _DTYPE_CODES[value.dtype], value.stride(0), value.stride(1),
            k_cache.data_ptr(), v_cache.data_ptr(), _DTYPE_CODES[k_cache.dtype],
            slot_mapping.data_ptr(), num_tokens, num_kv_heads, head_dim, num_blocks, block_size,
            error, _ERROR_LEN,
        )
        if status != 0:
            raise ValueError(f"store_kv: {error.value.decode()}")

    def rms_norm(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [num_tokens, hidden]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (normed, x + residual or None)
        """Same contract as kernels.rms_norm.rms_norm_ref (the new residual is a fresh tensor)."""
        rows, hidden = x.shape
        if weight.shape != (hidden,) or (residual is not None and residual.shape != x.shape):
            raise ValueError(f"rms_norm: x {tuple(x.shape)}, weight {tuple(weight.shape)} and residual "
                             f"{None if residual is None else tuple(residual.shape)} do not match")
        weight = weight.contiguous()
        out = torch.empty((rows, hidden), dtype=x.dtype)
        new_residual = torch.empty((rows, hidden), dtype=x.dtype) if residual is not None else None
        error = self._error_buffer()
        status = self._rms_norm(
            x.data_ptr(), x.stride(0), residual.data_ptr() if residual is not None else None,
            residual.stride(0) if residual is not None else 0, weight.data_ptr(), out.data_ptr(),
            new_residual.data_ptr() if new_residual is not None else None, _DTYPE_CODES[x.dtype], rows, hidden,
            eps, torch.get_num_threads(), error, _ERROR_LEN,
        )
        if status != 0:
            raise ValueError(f"rms_norm: {error.value.decode()}")
        return out, new_residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
        """Same contract as kernels.silu_mul.silu_and_mul_ref."""
        rows, width = gate_up.shape
        if width % 2:
            raise ValueError(f"silu_mul: gate_up has an odd width {width}")
        out = torch.empty((rows, width // 2), dtype=gate_up.dtype)
        error = self._error_buffer()
        status = self._silu_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), _DTYPE_CODES[gate_up.dtype],
                                rows, width // 2, torch.get_num_threads(), error, _ERROR_LEN)
        if status != 0:
            raise ValueError(f"silu_mul: {error.value.decode()}")
        return out

    def skinny_linear(
        self,
        x: torch.Tensor,  # [rows, in_features] float32
        weight: torch.Tensor,  # [out_features, in_features] float32 or bfloat16, contiguous
        bias: torch.Tensor | None = None,  # [out_features] float32
    ) -> torch.Tensor:  # [rows, out_features] float32
        """y = x W^T (+ b), streaming the weight once for all the rows (kernels/cpu/skinny_linear.cpp);
        each output's summation order is independent of the row count. A bf16 weight is widened to
        float32 as it is read (exactly): the result equals the float32 weight's bit for bit."""
        kernel = self._skinny_linear.get(weight.dtype)
        if kernel is None or weight.dtype is torch.int8:
            raise ValueError(f"skinny_linear: a {weight.dtype} weight (float32 or bfloat16; int8 takes "
                             "skinny_linear_int8)")
        return self._run_skinny_linear(kernel, x, weight, bias)

    def skinny_linear_int8(
        self,
        x: torch.Tensor,  # [rows, in_features] float32
        weight: torch.Tensor,  # [out_features, in_features] int8, contiguous
        scales: torch.Tensor,  # [out_features] float32
        bias: torch.Tensor | None = None,  # [out_features] float32
    ) -> torch.Tensor:  # [rows, out_features] float32
        """y = (x q^T) * scales (+ b): the int8 rows widened to float32 as they are read (exactly),
        each output's dot product scaled once; a quarter of a float32 weight's bytes."""
        if weight.dtype is not torch.int8 or scales.dtype is not torch.float32 or scales.shape != (weight.shape[0],):
            raise ValueError(f"skinny_linear_int8: weight {weight.dtype} {tuple(weight.shape)} with scales "
                             f"{scales.dtype} {tuple(scales.shape)} (int8 [N, K] and float32 [N])")
        return self._run_skinny_linear(self._skinny_linear[torch.int8], x, weight, bias, scales.contiguous())

    def try_skinny_linear(
        self,
        x: torch.Tensor,  # [rows, in_features]
        weight: torch.Tensor,  # [out_features, in_features]
        bias: torch.Tensor | None = None,  # [out_features]
        scales: torch.Tensor | None = None,  # [out_features] float32: an int8 weight's, which needs them
    ) -> torch.Tensor | None:  # [rows, out_features] float32, or None where supports_skinny_linear says no
        """skinny_linear where it takes these tensors, else None, checked once: the path of every
        few-row product of a decode step (~120 a step on the embedded model), where a separate
        supports_skinny_linear and skinny_linear's own checks cost ~2% of a one-stream float32
        step (AVX2 EPYC: 36.7 against 37.5 ms a token)."""
        kernel = self._skinny_kernel_for(x, weight, bias, scales)
        return None if kernel is None else self._run_skinny_linear(kernel, x, weight, bias, scales)

    def _run_skinny_linear(self, kernel: ctypes._CFuncPtr, x: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor | None, scales: torch.Tensor | None = None) -> torch.Tensor:
        out_features = weight.shape[0]
        if weight.dim() != 2 or weight.shape[1] != x.shape[1] or (bias is not None and bias.shape != (out_features,)):
            raise ValueError(f"skinny_linear: x {tuple(x.shape)}, weight {tuple(weight.shape)} and bias "
                             f"{None if bias is None else tuple(bias.shape)} do not match")
        pointers = (weight.data_ptr(),) if scales is None else (weight.data_ptr(), scales.data_ptr())
        return self._call_linear(kernel, "skinny_linear", x, pointers, out_features, bias)

    def _call_linear(self, kernel: ctypes._CFuncPtr, what: str, x: torch.Tensor, weight_pointers: tuple[int, ...],
                     out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
        """The call the linear kernels share (one C signature but for the weight's pointers), on
        tensors the caller checked: [rows, out_features] float32."""
        rows, in_features = x.shape
        if bias is not None:
            bias = bias.contiguous()
        out = torch.empty((rows, out_features), dtype=torch.float32)
        error = self._error_buffer()
        status = kernel(x.data_ptr(), x.stride(0) if rows > 1 else in_features, *weight_pointers,
                        bias.data_ptr() if bias is not None else None, out.data_ptr(), rows,
                        out_features, in_features, torch.get_num_threads(), error, _ERROR_LEN)
        if status != 0:
            raise ValueError(f"{what}: {error.value.decode()}")
        return out

    def panel_linear(
        self,
        x: torch.Tensor,  # [rows, in_features] float32, unit column stride
        panels: torch.Tensor,  # [out_features / 16, in_features, 16] float32, contiguous
        bias: torch.Tensor | None = None,  # [out_features] float32
    ) -> torch.Tensor:  # [rows, out_features] float32
        """y = x W^T (+ b) over a weight held in panels of 16 output channels (kernels/cpu/
        panel_linear.cpp), any number of rows; each output's summation order is independent of
        the row count."""
        if (x.dtype is not torch.float32 or x.dim() != 2 or x.stride(1) != 1 or not x.is_cpu
                or panels.dtype is not torch.float32 or panels.dim() != 3 or panels.shape[2] != PANEL_WIDTH
                or not panels.is_contiguous() or not panels.is_cpu or panels.shape[1] != x.shape[1]):
            raise ValueError(f"panel_linear: x {x.dtype} {tuple(x.shape)} and panels {panels.dtype} "
                             f"{tuple(panels.shape)} (float32 [rows, K] and [N / {PANEL_WIDTH}, K, {PANEL_WIDTH}])")
        out_features = panels.shape[0] * PANEL_WIDTH
        if bias is not None and (bias.dtype is not torch.float32 or not bias.is_cpu or bias.shape != (out_features,)):
            raise ValueError(f"panel_linear: bias {bias.dtype} {tuple(bias.shape)} for {out_features} outputs")
        return self._call_linear(self._panel_linear, "panel_linear", x, (panels.data_ptr(),), out_features, bias)

    @staticmethod
    def decoder_layer_weights(layers: list[DecoderLayerTensors]) -> ctypes.Array:
        """The C array decoder_layers takes, checked once: build it when the tensors are set up
        (their addresses must stay valid while it is used), not per call."""
        def address(t: torch.Tensor | None, what: str, dtypes: tuple[torch.dtype, ...]) -> int | None:
            if t is None:
                return None
            if not t.is_cpu or t.dtype not in dtypes or not t.is_contiguous():
                raise ValueError(f"decoder_layers: {what} must be a contiguous CPU tensor of {dtypes}, "
                                 f"got {t.dtype} {tuple(t.shape)}")
            return t.data_ptr()

        f32, weights = (torch.float32,), (torch.float32, torch.bfloat16, torch.int8)
        array = (DecoderLayerWeights * len(layers))()
        for entry, layer in zip(array, layers):
            entry.input_norm = address(layer.input_norm, "input_norm", f32)
            entry.post_norm = address(layer.post_norm, "post_norm", f32)
            for name in ("qkv", "o", "gate_up", "down"):
                weight = getattr(layer, name)
                setattr(entry, name, address(weight, name, weights))
                setattr(entry, f"{name}_bias", address(getattr(layer, f"{name}_bias"), f"{name}_bias", f32))
                in_panels = weight.dim() == 3
                if in_panels and (weight.dtype is not torch.float32 or weight.shape[2] != PANEL_WIDTH):
                    raise ValueError(f"decoder_layers: {name} {weight.dtype} {tuple(weight.shape)} is neither "
                                     f"[N, K] nor float32 panels [N / {PANEL_WIDTH}, K, {PANEL_WIDTH}]")
                setattr(entry, f"{name}_dtype", _PANELS_CODE if in_panels else _WEIGHT_CODES[weight.dtype])
                scales = getattr(layer, f"{name}_scales")
                if (weight.dtype is torch.int8) != (scales is not None):
                    raise ValueError(f"decoder_layers: {name} is {weight.dtype}; int8 weights, and only they, "
                                     "come with scales")
                if scales is not None and scales.shape != (weight.shape[0],):
                    raise ValueError(f"decoder_layers: {name}_scales {tuple(scales.shape)} for a weight "
                                     f"{tuple(weight.shape)}")
                setattr(entry, f"{name}_scales", address(scales, f"{name}_scales", f32))
            entry.k_cache = address(layer.k_cache, "k_cache", f32)
            entry.v_cache = address(layer.v_cache, "v_cache", f32)
            entry.sliding_window = layer.sliding_window or 0
        return array

    def _stack_arguments(self, stack: DecoderStack, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                         query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int,
                         hidden_size: int, out: torch.Tensor, error: ctypes.Array) -> tuple:
        """The arguments both one-call kernels end with (decoder_layers.cpp's, from slot_mapping on)."""
        return (slot_mapping.data_ptr(), block_table.data_ptr(), block_table.stride(0), block_table.shape[1],
                query_start_loc.data_ptr(), seq_lens.data_ptr(), seq_lens.shape[0], num_tokens, hidden_size,
                stack.num_heads, stack.num_kv_heads, stack.head_dim, stack.intermediate, stack.num_blocks,
                stack.block_size, stack.scale, stack.eps, torch.get_num_threads(), out.data_ptr(), error, _ERROR_LEN)

    def decoder_layers(
        self,
        stack: DecoderStack,
        hidden: torch.Tensor,  # [num_tokens, hidden] float32: the first layer's input
        cos_sin: torch.Tensor,  # [num_tokens, head_dim] float32: each token's rotary row (cos | sin)
        slot_mapping: torch.Tensor,  # [num_tokens] int64
        block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
        query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
        seq_lens: torch.Tensor,  # [num_reqs] int32
    ) -> torch.Tensor:  # [num_tokens, hidden] float32: the final norm's output
        """A few-row step through every layer in one call (kernels/cpu/decoder_layers.cpp): the
        same kernels as the layer-by-layer path, bit for bit, without its Python between them.
        The tensors must be contiguous CPU ones of the dtypes above (the caller checks once)."""
        num_tokens, hidden_size = hidden.shape
        out = torch.empty((num_tokens, hidden_size), dtype=torch.float32)
        error = self._error_buffer()
        status = self._decoder_layers(
            ctypes.addressof(stack.layers), len(stack.layers), stack.final_norm.data_ptr(), hidden.data_ptr(),
            cos_sin.data_ptr(), *self._stack_arguments(stack, slot_mapping, block_table, query_start_loc, seq_lens,
                                                       num_tokens, hidden_size, out, error))
        if status != 0:
            raise ValueError(f"decoder_layers: {error.value.decode()}")
        return out

    def eagle_forward(
        self,
        stack: DecoderStack,  # the head's one layer
        token_ids: torch.Tensor,  # [num_tokens] int64: each position's next token
        embedding: torch.Tensor,  # [vocab, hidden] float32, contiguous
        states: torch.Tensor,  # [num_tokens, hidden] float32, unit column stride: the target's states
        fc_weight: torch.Tensor,  # [hidden, 2 * hidden] float32, bfloat16 or int8, contiguous
        fc_scales: torch.Tensor | None,  # [hidden] float32: an int8 fc's
        cos_sin_table: torch.Tensor,  # [max_positions, head_dim] float32, contiguous
        positions: torch.Tensor,  # [num_tokens] int64
        slot_mapping: torch.Tensor,  # as decoder_layers takes them
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:  # [num_tokens, hidden] float32: the head's predicted states
        """An EAGLE head's pass in one call (kernels/cpu/eagle_head.cpp): the embedding rows and
        the states joined, the fc product, then decoder_layers over the head's layer, through the
        same kernels as the Python path, bit for bit. The tensors must be the dtypes above, on the
        CPU, with the strides above (the caller checks once)."""
        num_tokens, hidden_size = states.shape
        out = torch.empty((num_tokens, hidden_size), dtype=torch.float32)
        error = self._error_buffer()
        status = self._eagle_forward(
            token_ids.data_ptr(), embedding.data_ptr(), embedding.shape[0], states.data_ptr(), states.stride(0),
            fc_weight.data_ptr(), _WEIGHT_CODES[fc_weight.dtype], None if fc_scales is None else fc_scales.data_ptr(),
            ctypes.addressof(stack.layers), stack.final_norm.data_ptr(), cos_sin_table.data_ptr(),
            cos_sin_table.shape[0], positions.data_ptr(),
            *self._stack_arguments(stack, slot_mapping, block_table, query_start_loc, seq_lens, num_tokens,
                                   hidden_size, out, error))
        if status != 0:
            raise ValueError(f"eagle_forward: {error.value.decode()}")
        return out

    def draft_top1(
        self,
        x: torch.Tensor,  # [num_rows, hidden] float32, contiguous
        weight: torch.Tensor,  # [vocab_rows, hidden] float32, bfloat16 or int8, contiguous
        scales: torch.Tensor | None,  # [vocab_rows] float32: an int8 weight's
        vocab_ids: torch.Tensor | None,  # [vocab_rows] int64: each row's target token id
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([num_rows] int64 token ids, [num_rows] float32 probabilities)
        """A draft's greedy token and its softmax probability over the rows of its output head
        (kernels/cpu/eagle_head.cpp): the logits are the few-row kernel's, the token their first
        maximum (torch.argmax's), the probability summed in the kernel's own order."""
        num_rows, hidden = x.shape
        if (weight.dim() != 2 or weight.shape[1] != hidden or (weight.dtype is torch.int8) != (scales is not None)
                or (vocab_ids is not None and vocab_ids.shape != (weight.shape[0],))):
            raise ValueError(f"draft_top1: x {tuple(x.shape)}, weight {weight.dtype} {tuple(weight.shape)}, "
                             f"scales {scales is not None}, vocab_ids "
                             f"{None if vocab_ids is None else tuple(vocab_ids.shape)} do not match")
        tokens = torch.empty(num_rows, dtype=torch.int64)
        probs = torch.empty(num_rows, dtype=torch.float32)
        error = self._error_buffer()
        status = self._draft_top1(
            x.data_ptr(), num_rows, hidden, weight.data_ptr(), _WEIGHT_CODES[weight.dtype],
            None if scales is None else scales.data_ptr(), weight.shape[0],
            None if vocab_ids is None else vocab_ids.data_ptr(), torch.get_num_threads(), tokens.data_ptr(),
            probs.data_ptr(), error, _ERROR_LEN,
        )
        if status != 0:
            raise ValueError(f"draft_top1: {error.value.decode()}")
        return tokens, probs
