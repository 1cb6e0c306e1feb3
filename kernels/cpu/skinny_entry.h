// The few-row products' C entry points (skinny_linear.cpp, panel_linear.cpp), declared for the sources that call
// them (decoder_layers.cpp, eagle_head.cpp), and their dispatch by a weight's dtype code.
#pragma once

#include <cstdint>
#include <cstdio>

extern "C" {
int draftgate_skinny_linear(const float* x, int64_t x_stride, const float* w, const float* bias, float* y, int64_t M,
                            int64_t N, int64_t K, int32_t num_threads, char* error, int64_t error_len);
int draftgate_skinny_linear_bf16(const float* x, int64_t x_stride, const void* w, const float* bias, float* y,
                                 int64_t M, int64_t N, int64_t K, int32_t num_threads, char* error, int64_t error_len);
int draftgate_skinny_linear_int8(const float* x, int64_t x_stride, const int8_t* w, const float* scales,
                                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, int32_t num_threads,
                                 char* error, int64_t error_len);
int draftgate_panel_linear(const float* x, int64_t x_stride, const float* panels, const float* bias, float* y, int64_t M,
                           int64_t N, int64_t K, int32_t num_threads, char* error, int64_t error_len);
}

namespace draftgate {

// A linear weight's dtype code (kernels/cpu/library.py's _WEIGHT_CODES).
// kWeightFloat32Panels: float32 in panels of 16 output channels, [N / 16, K, 16] (panel_linear.cpp).
enum WeightCode : int64_t { kWeightFloat32 = 0, kWeightBFloat16 = 1, kWeightInt8 = 2, kWeightFloat32Panels = 3 };

// y [M, N] = x [M, K] W^T (+ bias), x's rows contiguous, W [N, K] held as `code` (int8 with its
// scales [N]). K is passed as x's stride, as the Python wrapper passes it for one row (the
// kernel ignores the stride then), so the call is the Python path's.
inline int linear(const float* x, const void* w, int64_t code, const float* scales, const float* bias, float* y,
                  int64_t M, int64_t N, int64_t K, int32_t threads, char* error, int64_t error_len) {
  if (code == kWeightInt8)
    return draftgate_skinny_linear_int8(x, K, static_cast<const int8_t*>(w), scales, bias, y, M, N, K, threads, error,
                                        error_len);
  if (code == kWeightBFloat16)
    return draftgate_skinny_linear_bf16(x, K, w, bias, y, M, N, K, threads, error, error_len);
  if (code == kWeightFloat32)
    return draftgate_skinny_linear(x, K, static_cast<const float*>(w), bias, y, M, N, K, threads, error, error_len);
  if (code == kWeightFloat32Panels)
    return draftgate_panel_linear(x, K, static_cast<const float*>(w), bias, y, M, N, K, threads, error, error_len);
  std::snprintf(error, static_cast<size_t>(error_len), "unknown weight dtype code %lld", static_cast<long long>(code));
  return 1;
}

}  // namespace draftgate
