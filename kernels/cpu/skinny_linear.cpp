// float32 y = x W^T (+ b) for the few rows of decoding and verification (1 to a few dozen), where
// the product is bound by reading the weight from memory, not by arithmetic.
//
// Each thread takes a static range of output channels n and, for each, streams the weight row
// W[n] once while every input row keeps its own accumulator: up to 8 rows per pass (8 ymm
// accumulators, one for the weight and one for x: 10 of the 16 registers), further groups of 8
// rows re-reading W[n] from L1. A software prefetch 1 KiB ahead in the weight keeps the stream
// going (without it, and with two weight rows per tile, the time grew with the row count as
// oneDNN's does). So the weight crosses the memory bus once whatever the row count, which
// oneDNN's prepacked kernel does not manage at 2-16 rows on an AVX2 EPYC (its lm_head: 6.6 ms at
// one row, 11.5 at 8; kernels/cpu_float32_linear.py has the measurements).
//
// Batch invariance: an output is summed in the same order whatever the other rows are (8 lanes
// of fused multiply-adds over k, the lanes folded as (l0+l4 + l1+l5) + (l2+l6 + l3+l7), then the
// K % 8 tail), so a row's result never depends on how many rows share the call. The portable
// build (no AVX2/FMA, or DRAFTGATE_PORTABLE) computes exactly the same sums with std::fma, and
// its results are bit-identical to the AVX2 build's.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#if defined(__AVX2__) && defined(__FMA__) && !defined(DRAFTGATE_PORTABLE)
#include <immintrin.h>
#define DRAFTGATE_SKINNY_AVX2 1
#endif

namespace draftgate {
namespace {

constexpr int kLanes8 = 8;  // float32 lanes of an AVX2 register, and of the portable emulation
constexpr int kRowGroup = 8;  // input rows sharing one pass over a weight row
constexpr int64_t kPrefetchAhead = 256;  // floats (1 KiB) ahead of the weight read

#ifdef DRAFTGATE_SKINNY_AVX2
inline float fold(__m256 v) {  // (l0+l4 + l1+l5) + (l2+l6 + l3+l7)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s_i = l_i + l_{i+4}
  s = _mm_hadd_ps(s, s);  // s0+s1, s2+s3, ...
  s = _mm_hadd_ps(s, s);  // (s0+s1) + (s2+s3)
  return _mm_cvtss_f32(s);
}

// out[r] = dot(x[r, :K], w[:K]) for R rows `x_stride` floats apart.
template <int R>
inline void dot_rows(const float* x, int64_t x_stride, const float* w, int64_t K, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t k_vec = K - K % kLanes8;
  for (int64_t k = 0; k < k_vec; k += kLanes8) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k + kPrefetchAhead), _MM_HINT_T0);
    const __m256 wv = _mm256_loadu_ps(w + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * x_stride + k), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float sum = fold(acc[r]);
    for (int64_t k = k_vec; k < K; ++k) sum = std::fma(w[k], x[r * x_stride + k], sum);
    out[r] = sum;
  }
}
#else
template <int R>
inline void dot_rows(const float* x, int64_t x_stride, const float* w, int64_t K, float* out) {
  float acc[R][kLanes8] = {};
  const int64_t k_vec = K - K % kLanes8;
  for (int64_t k = 0; k < k_vec; k += kLanes8)
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kLanes8; ++l) acc[r][l] = std::fma(w[k + l], x[r * x_stride + k + l], acc[r][l]);
  for (int r = 0; r < R; ++r) {
    const float* a = acc[r];
    float sum = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for (int64_t k = k_vec; k < K; ++k) sum = std::fma(w[k], x[r * x_stride + k], sum);
    out[r] = sum;
  }
}
#endif

inline void dot_group(int rows, const float* x, int64_t x_stride, const float* w, int64_t K, float* out) {
  switch (rows) {
    case 1: dot_rows<1>(x, x_stride, w, K, out); break;
    case 2: dot_rows<2>(x, x_stride, w, K, out); break;
    case 3: dot_rows<3>(x, x_stride, w, K, out); break;
    case 4: dot_rows<4>(x, x_stride, w, K, out); break;
    case 5: dot_rows<5>(x, x_stride, w, K, out); break;
    case 6: dot_rows<6>(x, x_stride, w, K, out); break;
    case 7: dot_rows<7>(x, x_stride, w, K, out); break;
    default: dot_rows<8>(x, x_stride, w, K, out); break;
  }
}

}  // namespace
}  // namespace draftgate

using namespace draftgate;

// x: [M, K] rows `x_stride` floats apart; w: [N, K] contiguous; bias: [N] or null; y: [M, N]
// contiguous. Returns 0, or 1 with a message in `error`.
extern "C" int draftgate_skinny_linear(const float* x, int64_t x_stride, const float* w, const float* bias, float* y,
                                       int64_t M, int64_t N, int64_t K, int32_t num_threads, char* error,
                                       int64_t error_len) {
  if (M < 0 || N < 0 || K < 0 || x_stride < K) {
    std::snprintf(error, static_cast<size_t>(error_len), "bad sizes M=%lld N=%lld K=%lld x_stride=%lld",
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                  static_cast<long long>(x_stride));
    return 1;
  }
  // Below ~64K multiply-adds a thread team costs more than it saves.
  const int threads = M * N * K >= (int64_t(1) << 16) ? std::max(1, static_cast<int>(num_threads)) : 1;
  // Balanced groups (12 rows: 6 + 6, not 8 + 4): a group's accumulators are its independent
  // dependency chains, and 4 chains leave the FMA units waiting on their 4-5 cycle latency.
  const int64_t num_groups = (M + kRowGroup - 1) / kRowGroup;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* w_row = w + n * K;
    const float b = bias != nullptr ? bias[n] : 0.0f;
    float sums[kRowGroup];
    for (int64_t group = 0, m0 = 0; group < num_groups; ++group) {
      const int rows = static_cast<int>(M / num_groups + (group < M % num_groups ? 1 : 0));
      dot_group(rows, x + m0 * x_stride, x_stride, w_row, K, sums);
      for (int r = 0; r < rows; ++r) y[(m0 + r) * N + n] = sums[r] + b;
      m0 += rows;
    }
  }
  return 0;
}
