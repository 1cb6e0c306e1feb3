// SwiGLU's activation on CPUs: out = silu(gate) * up over gate_up = [gate | up], in one pass
// instead of the reference's chunk, silu and multiply (two temporaries per call).
//
// The contract is kernels/silu_mul.py's silu_and_mul_ref: silu is computed in float32 and rounded
// to the input dtype, then multiplied by up (rounded again), as torch does for bf16 tensors. exp
// is vec.h's polynomial (about 1 ulp), so float32 results may differ from torch's by an ulp.
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "vec.h"

namespace draftgate {
namespace {

enum DType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

template <typename T>
void silu_mul_rows(const T* gate_up, int64_t stride, T* out, int64_t rows, int64_t d, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * stride;
    const T* up = gate + d;
    T* o = out + r * d;
    for (int64_t i = 0; i < d; i += kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(kLanes, d - i));
      const Vec g = vload(gate + i, n);
      const Vec silu = vround_to(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), gate);
      vstore(o + i, vmul(silu, vload(up + i, n)), n);
    }
  }
}

}  // namespace
}  // namespace draftgate

using namespace draftgate;

// gate_up: [rows, 2 * d] rows `stride` elements apart; out: [rows, d] contiguous; one dtype.
// Returns 0, or 1 with a message in `error`.
extern "C" int draftgate_silu_mul(const void* gate_up, int64_t stride, void* out, int32_t dtype, int64_t rows,
                                  int64_t d, int32_t num_threads, char* error, int64_t error_len) {
  if (dtype != kFloat32 && dtype != kBFloat16) {
    std::snprintf(error, static_cast<size_t>(error_len), "unsupported dtype code %d", dtype);
    return 1;
  }
  const int threads = rows * d >= (int64_t(1) << 16) ? std::max(1, num_threads) : 1;
  if (dtype == kFloat32)
    silu_mul_rows(static_cast<const float*>(gate_up), stride, static_cast<float*>(out), rows, d, threads);
  else
    silu_mul_rows(static_cast<const bf16_t*>(gate_up), stride, static_cast<bf16_t*>(out), rows, d, threads);
  return 0;
}
