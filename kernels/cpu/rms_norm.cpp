// RMSNorm with the residual add fused, on CPUs: one pass per row instead of the reference's
// add, widen, normalize, narrow and scale (five tensor ops and their temporaries per call).
//
// The contract is kernels/rms_norm.py's rms_norm_ref, Hugging Face's LlamaRMSNorm: the add
// happens in the input dtype (a bf16 sum is rounded to bf16), the mean of squares is taken in
// float32, the normalized value is rounded to the input dtype and then multiplied by the weight
// (rounded again). Only the order of the float32 sum of squares differs from torch's.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "vec.h"

namespace draftgate {
namespace {

enum DType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

template <typename T>
void norm_rows(const T* x, int64_t x_stride, const T* residual, int64_t residual_stride, const T* weight, T* out,
               T* residual_out, int64_t rows, int64_t hidden, float eps, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * x_stride;
    T* outr = out + r * hidden;
    Vec squares = vzero();
    if (residual != nullptr) {
      // The row the reference normalizes is x + residual rounded to the input dtype: that is
      // what residual_out receives, and the second pass reads it back from there.
      const T* rr = residual + r * residual_stride;
      T* ro = residual_out + r * hidden;
      for (int64_t i = 0; i < hidden; i += kLanes) {
        const int n = static_cast<int>(std::min<int64_t>(kLanes, hidden - i));
        const Vec v = vround_to(vadd(vload(xr + i, n), vload(rr + i, n)), xr);
        vstore(ro + i, v, n);
        squares = vfma(v, v, squares);
      }
      xr = ro;
    } else {
      for (int64_t i = 0; i < hidden; i += kLanes) {
        const Vec v = vload(xr + i, static_cast<int>(std::min<int64_t>(kLanes, hidden - i)));
        squares = vfma(v, v, squares);
      }
    }
    const Vec inv = vset1(1.0f / std::sqrt(vsum(squares) / static_cast<float>(hidden) + eps));
    for (int64_t i = 0; i < hidden; i += kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(kLanes, hidden - i));
      const Vec normed = vround_to(vmul(vload(xr + i, n), inv), xr);
      vstore(outr + i, vmul(vload(weight + i, n), normed), n);
    }
  }
}

}  // namespace
}  // namespace draftgate

using namespace draftgate;

// x: [rows, hidden] rows x_stride apart (elements); residual: null or [rows, hidden] rows
// residual_stride apart; weight: [hidden]; out and residual_out: [rows, hidden] contiguous
// (residual_out may be residual itself when that is contiguous: each element is read before it
// is written). All in one dtype. Returns 0, or 1 with a message in `error`.
extern "C" int draftgate_rms_norm(const void* x, int64_t x_stride, const void* residual, int64_t residual_stride,
                                  const void* weight, void* out, void* residual_out, int32_t dtype, int64_t rows,
                                  int64_t hidden, double eps, int32_t num_threads, char* error, int64_t error_len) {
  if (dtype != kFloat32 && dtype != kBFloat16) {
    std::snprintf(error, static_cast<size_t>(error_len), "unsupported dtype code %d", dtype);
    return 1;
  }
  if (residual != nullptr && residual_out == nullptr) {
    std::snprintf(error, static_cast<size_t>(error_len), "a residual needs residual_out");
    return 1;
  }
  // Small steps (a few decode rows) are not worth waking a thread team for.
  const int threads = rows * hidden >= (int64_t(1) << 16) ? std::max(1, num_threads) : 1;
  if (dtype == kFloat32)
    norm_rows(static_cast<const float*>(x), x_stride, static_cast<const float*>(residual), residual_stride,
              static_cast<const float*>(weight), static_cast<float*>(out), static_cast<float*>(residual_out), rows,
              hidden, static_cast<float>(eps), threads);
  else
    norm_rows(static_cast<const bf16_t*>(x), x_stride, static_cast<const bf16_t*>(residual), residual_stride,
              static_cast<const bf16_t*>(weight), static_cast<bf16_t*>(out), static_cast<bf16_t*>(residual_out),
              rows, hidden, static_cast<float>(eps), threads);
  return 0;
}
