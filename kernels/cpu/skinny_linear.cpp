// float32 y = x W^T (+ b) for the few rows of decoding and verification (1 to a few dozen), where
// the product is bound by reading the weight from memory, not by arithmetic.
//
// Each thread takes a static range of blocks of output channels n. The first pass streams each
// weight row W[n] once while up to 10 input rows keep their own accumulators (10 ymm
// accumulators, one for the weight and one for x: 12 of the 16 registers; 8 rows where 10 rows of
// x would not stay in L1 beside the stream), with a software prefetch 1 KiB ahead
// in the weight (without it the time grew with the row count as oneDNN's does). Rows past the
// first pass re-read the block's weight rows from cache in 2 x 4 tiles (see the loop). So the
// weight crosses the memory bus once whatever the row count, which oneDNN's prepacked kernel
// does not manage at 2-16 rows on an AVX2 EPYC (its lm_head: 6.6 ms at one row, 11.5 at 8;
// kernels/small_rows_linear.py has the measurements).
//
// Batch invariance: an output is summed in the same order whatever the other rows are and
// whichever tile computes it (8 lanes of fused multiply-adds over k, the lanes folded as
// (l0+l4 + l1+l5) + (l2+l6 + l3+l7), then the K % 8 tail, then the bias), so a row's result never
// depends on how many rows share the call. The portable build (no AVX2/FMA, or DRAFTGATE_PORTABLE)
// computes exactly the same sums with std::fma, and its results are bit-identical to the AVX2
// build's.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "vec.h"  // bf16_t, to_float

#if defined(__AVX2__) && defined(__FMA__) && !defined(DRAFTGATE_PORTABLE)
#include <immintrin.h>
#define DRAFTGATE_SKINNY_AVX2 1
#endif

namespace draftgate {
namespace {

constexpr int kLanes8 = 8;  // float32 lanes of an AVX2 register, and of the portable emulation
// Input rows sharing the first pass over a weight row: up to kWideFirstRows where that many fit
// in kFirstRowsBytes (L1 is 32 KiB on Zen 2; at K = 576, 10 rows are 23 KiB), else up to 8.
constexpr int kFirstRows = 8;
constexpr int kWideFirstRows = 10;
constexpr int64_t kFirstRowsBytes = 24 * 1024;
constexpr int64_t kPrefetchBytes = 1024;  // how far ahead of the weight read to prefetch
// How a pass prefetches its weight: not at all (it is in cache), to keep (T0: a later pass over
// the same rows reads them from L2), or to stream past the caches (NTA, float32 weights read by
// one pass only). Why stream: a decode step reads ~540 MB of the target's float32 weights once,
// and kept, every line goes on from L2 into the L3 (a victim cache on AMD), evicting whatever
// was there, the EAGLE head's weights among them, which the head then reads from memory right
// after every target step. Streamed (AVX2 EPYC, 2 threads, 16 MiB L3): the head's fc and layer
// at one position 0.46 -> 0.35 ms (chat, one stream), and the target's own products no slower
// (cycled from memory: lm_head at 1 / 4 rows 3.64 / 3.56 -> 3.39 / 3.38 ms, the decoder's
// linears within 3%); plain decoding's step 18.8 -> 18.0 ms.
enum Prefetch : int { kNoPrefetch = 0, kKeep = 1, kStream = 2 };

// bf16 weights (vec.h's bf16_t) are the top 16 bits of a float32: widening is exact, so a
// product over bf16 weights is the float32 product over the widened weights, bit for bit, at
// half the bytes read.
//
// int8 weights with one float32 scale per weight row (output channel): the dot product runs over
// the integers widened to float32 (exact) and is multiplied by the row's scale once, before the
// bias: a quarter of float32's bytes, for drafts whose passes are bound by reading their weights.

#ifdef DRAFTGATE_SKINNY_AVX2
inline float fold(__m256 v) {  // (l0+l4 + l1+l5) + (l2+l6 + l3+l7)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s_i = l_i + l_{i+4}
  s = _mm_hadd_ps(s, s);  // s0+s1, s2+s3, ...
  s = _mm_hadd_ps(s, s);  // (s0+s1) + (s2+s3)
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const int8_t* w) {  // 8 int8 -> 8 float32 (exact), scaled once per output
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}
inline __m256 load8(const bf16_t* w) {  // 8 bf16 -> 8 float32, shifted into the high halves
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// out[r * out_stride + t] = dot(x[r, :K], w[t, :K]) for R input rows `x_stride` floats apart and
// NT weight rows K elements apart. kPrefetch: the weight comes from memory (the first pass over it),
// prefetched to keep or to stream.
template <int NT, int R, int kPrefetch, typename W>
inline void dot_tile(const float* x, int64_t x_stride, const W* w, int64_t K, float* out, int64_t out_stride) {
  // One weight row at a time: kPrefetchBytes ahead in the stream (rows are contiguous, so into the
  // next row near its end). NT rows at a time read NT rows side by side, so 1 KiB ahead would land
  // in rows the tile is reading already: the same column NT rows on, the next tile's, instead.
  const int64_t ahead = NT == 1 ? int64_t(kPrefetchBytes / sizeof(W)) : NT * K;
  __m256 acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
  const int64_t k_vec = K - K % kLanes8;
  for (int64_t k = 0; k < k_vec; k += kLanes8) {
    __m256 wv[NT];
    for (int t = 0; t < NT; ++t) {
      if (kPrefetch == kKeep) _mm_prefetch(reinterpret_cast<const char*>(w + t * K + k + ahead), _MM_HINT_T0);
      if (kPrefetch == kStream) _mm_prefetch(reinterpret_cast<const char*>(w + t * K + k + ahead), _MM_HINT_NTA);
      wv[t] = load8(w + t * K + k);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * x_stride + k);
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm256_fmadd_ps(wv[t], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      float sum = fold(acc[t][r]);
      for (int64_t k = k_vec; k < K; ++k) sum = std::fma(to_float(w[t * K + k]), x[r * x_stride + k], sum);
      out[r * out_stride + t] = sum;
    }
}
#else
template <int NT, int R, int kPrefetch, typename W>
inline void dot_tile(const float* x, int64_t x_stride, const W* w, int64_t K, float* out, int64_t out_stride) {
  float acc[NT][R][kLanes8] = {};
  const int64_t k_vec = K - K % kLanes8;
  for (int64_t k = 0; k < k_vec; k += kLanes8)
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r)
        for (int l = 0; l < kLanes8; ++l)
          acc[t][r][l] = std::fma(to_float(w[t * K + k + l]), x[r * x_stride + k + l], acc[t][r][l]);
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      const float* a = acc[t][r];
      float sum = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
      for (int64_t k = k_vec; k < K; ++k) sum = std::fma(to_float(w[t * K + k]), x[r * x_stride + k], sum);
      out[r * out_stride + t] = sum;
    }
}
#endif

// The first pass over one weight row, streamed from memory: 1 to kWideFirstRows input rows.
// Kept out of line: its loops need a register for each input row's pointer, and inlined into the
// OpenMP body below (as GCC 12 chose after an unrelated change to that body) they spilled those
// pointers and reloaded them every 8 columns: the lm_head took 7.1 ms at 8 rows against 4.7.
template <int kPrefetch, typename W>
__attribute__((noinline)) void first_pass(int rows, const float* x, int64_t x_stride, const W* w, int64_t K, float* out,
                       int64_t out_stride) {
  switch (rows) {
    case 1: dot_tile<1, 1, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 2: dot_tile<1, 2, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 3: dot_tile<1, 3, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 4: dot_tile<1, 4, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 5: dot_tile<1, 5, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 6: dot_tile<1, 6, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 7: dot_tile<1, 7, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 8: dot_tile<1, 8, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    case 9: dot_tile<1, 9, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
    default: dot_tile<1, 10, kPrefetch>(x, x_stride, w, K, out, out_stride); break;
  }
}

// The first pass over bf16 or int8 weight rows [0, num_weight_rows) for 1 to 4 input rows. With
// one weight row at a time such a pass has only 1-4 accumulator chains, and each multiply-add
// waits on the one before it in its chain (4-5 cycles): over weights of 1-2 bytes that, not the
// memory, bounds it. Taking 2 or 4 weight rows at once gives 4-8 chains. Every output still has
// its own accumulator over the same k order, so the sums, bit for bit, are those of one row at a
// time. Measured on an AVX2 EPYC, 2 threads, the EAGLE head's 8192 x 576 output head at one row,
// warm in cache: 0.41 ms (int8) and 0.42 (bf16) one weight row at a time, 0.17 both with this.
// Cycled from memory, bf16 at 1 / 2 / 4 rows: 0.42 / 0.48 / 0.57 -> 0.45 / 0.46 / 0.46 ms;
// int8 then takes 0.26 / 0.27 / 0.39. float32 weights keep one row at a time: four bytes a weight
// keep them bound by memory, and side by side their rows streamed 5-13% slower (lm_head, 1-4 rows).
template <typename W>
__attribute__((noinline)) void first_pass_few(int rows, const float* x, int64_t x_stride, const W* w, int64_t K,
                                              float* out, int64_t out_stride, int64_t num_weight_rows) {
  int64_t t = 0;
  switch (rows) {
    case 1:
      for (; t + 4 <= num_weight_rows; t += 4) dot_tile<4, 1, kKeep>(x, x_stride, w + t * K, K, out + t, out_stride);
      break;
    case 2:
      for (; t + 4 <= num_weight_rows; t += 4) dot_tile<4, 2, kKeep>(x, x_stride, w + t * K, K, out + t, out_stride);
      break;
    case 3:
      for (; t + 2 <= num_weight_rows; t += 2) dot_tile<2, 3, kKeep>(x, x_stride, w + t * K, K, out + t, out_stride);
      break;
    default:
      for (; t + 2 <= num_weight_rows; t += 2) dot_tile<2, 4, kKeep>(x, x_stride, w + t * K, K, out + t, out_stride);
      break;
  }
  for (; t < num_weight_rows; ++t) first_pass<kKeep>(rows, x, x_stride, w + t * K, K, out + t, out_stride);
}

// scales: [N] float32 for int8 weights (each output is its dot product times its row's scale),
// null otherwise.
template <typename W>
int skinny_linear(const float* x, int64_t x_stride, const W* w, const float* scales, const float* bias, float* y,
                  int64_t M, int64_t N, int64_t K, int32_t num_threads, char* error, int64_t error_len) {
  if (M < 0 || N < 0 || K < 0 || x_stride < K) {
    std::snprintf(error, static_cast<size_t>(error_len), "bad sizes M=%lld N=%lld K=%lld x_stride=%lld",
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                  static_cast<long long>(x_stride));
    return 1;
  }
  if (M == 0 || N == 0) return 0;
  // Below ~64K multiply-adds a thread team costs more than it saves.
  const int threads = M * N * K >= (int64_t(1) << 16) ? std::max(1, static_cast<int>(num_threads)) : 1;
  // Up to max_first rows (10 at K <= 614, else 8): one pass per weight row, streamed from memory,
  // each input row with its own accumulator. A first pass of 8 left 9 rows at 8 rows' time plus a
  // tile pass's (a step's cost jumped from 8 tokens to 9); 10 fit in the stream's time at K = 576
  // (lm_head, 2 threads: 9 rows 5.7 ms against 7.2, 10 rows 6.1 against 7.1, 13 rows 7.9 against
  // 9.4; 1-8 and 11-12 rows unchanged). A first pass of 11 or 12 rows was slower than 7-8 plus a
  // tile pass (13 loads per 12 multiply-adds), and at K = 1536 (down) 10 rows of x (60 KiB) spill
  // L1. More rows: the first pass takes max_first - 3 to max_first of them, chosen so that the
  // rest split into groups of 4, and the rest go through blocks of kBlockRows weight rows
  // (72 KiB at K = 576, in L2): for each group of 4 input rows (in L1), 2 x 4 tiles over the
  // block's pairs of weight rows, 8 accumulators, 6 loads for 8 multiply-adds where a second
  // 1 x 8 pass needed 9. Taking the input rows in the outer loop keeps them in L1 (24 rows of 576
  // floats are 54 KiB, more than L1) and leaves the weight, 2 loads of the 6, to L2. lm_head
  // (49152 x 576) on an AVX2 EPYC, 2 threads: 16 rows 7.9 ms against 9.9 with a second 1 x 8
  // pass, 24 rows 11.4 against 16.8. At least 5 rows in the first pass keep 5 dependency chains
  // in flight against the FMA's 4-5 cycle latency.
  constexpr int64_t kBlockRows = 32;
  const int64_t max_first = std::clamp<int64_t>(kFirstRowsBytes / (K * int64_t(sizeof(float))), kFirstRows,
                                                 kWideFirstRows);
  const int first_rows = static_cast<int>(M <= max_first ? M : M - 4 * ((M - max_first + 3) / 4));
  const int64_t num_blocks = (N + kBlockRows - 1) / kBlockRows;
  // float32 weights read by this one pass stream past the caches (see Prefetch); a tile pass
  // re-reads the block from L2, so with one the first pass keeps them.
  const bool stream = sizeof(W) == sizeof(float) && first_rows == M;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t block = 0; block < num_blocks; ++block) {
    const int64_t n_begin = block * kBlockRows, n_end = std::min(N, n_begin + kBlockRows);
    if (sizeof(W) < sizeof(float) && first_rows <= 4)  // float32 weights: bound by memory as it is
      first_pass_few(first_rows, x, x_stride, w + n_begin * K, K, y + n_begin, N, n_end - n_begin);
    else if (stream)
      for (int64_t n = n_begin; n < n_end; ++n) first_pass<kStream>(first_rows, x, x_stride, w + n * K, K, y + n, N);
    else
      for (int64_t n = n_begin; n < n_end; ++n) first_pass<kKeep>(first_rows, x, x_stride, w + n * K, K, y + n, N);
    for (int64_t m = first_rows; m < M; m += 4) {
      const float* x_group = x + m * x_stride;
      float* y_group = y + m * N;
      int64_t n = n_begin;
      for (; n + 2 <= n_end; n += 2) dot_tile<2, 4, kNoPrefetch>(x_group, x_stride, w + n * K, K, y_group + n, N);
      if (n < n_end) dot_tile<1, 4, kNoPrefetch>(x_group, x_stride, w + n * K, K, y_group + n, N);
    }
    if (scales != nullptr) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n_begin; n < n_end; ++n) y[m * N + n] *= scales[n];
    }
    if (bias != nullptr) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n_begin; n < n_end; ++n) y[m * N + n] += bias[n];
    }
  }
  return 0;
}

}  // namespace
}  // namespace draftgate

// x: [M, K] float32 rows `x_stride` floats apart; w: [N, K] contiguous, float32, (the _bf16
// entry) bf16 or (the _int8 entry, below) int8; bias: [N] float32 or null; y: [M, N] float32 contiguous. Returns 0, or 1 with a
// message in `error`.
extern "C" int draftgate_skinny_linear(const float* x, int64_t x_stride, const float* w, const float* bias, float* y,
                                       int64_t M, int64_t N, int64_t K, int32_t num_threads, char* error,
                                       int64_t error_len) {
  return draftgate::skinny_linear(x, x_stride, w, nullptr, bias, y, M, N, K, num_threads, error, error_len);
}

extern "C" int draftgate_skinny_linear_bf16(const float* x, int64_t x_stride, const draftgate::bf16_t* w,
                                            const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                                            int32_t num_threads, char* error, int64_t error_len) {
  return draftgate::skinny_linear(x, x_stride, w, nullptr, bias, y, M, N, K, num_threads, error, error_len);
}

// w: [N, K] int8 contiguous; scales: [N] float32 (y = (x q^T) * scales + bias).
extern "C" int draftgate_skinny_linear_int8(const float* x, int64_t x_stride, const int8_t* w, const float* scales,
                                            const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                                            int32_t num_threads, char* error, int64_t error_len) {
  if (scales == nullptr) {
    std::snprintf(error, static_cast<size_t>(error_len), "int8 weights need their scales");
    return 1;
  }
  return draftgate::skinny_linear(x, x_stride, w, scales, bias, y, M, N, K, num_threads, error, error_len);
}
