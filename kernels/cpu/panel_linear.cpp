// float32 y = x W^T (+ b) over a weight held in panels of 16 output channels: W as
// [N / 16, K, 16], panel p holding W[16p + j][k] at [p][k][j]. The layout of an outer-product
// (BLIS-style) kernel: each step over k loads the 16 weights of one k (64 bytes, one cache line,
// the panel read front to back as one stream), broadcasts x[m][k] for each of up to 6 input rows
// and adds the 16 x MR products into MR x 2 register accumulators, one per output.
//
// Why not the row kernel (skinny_linear.cpp), which reads W as [N, K]: there each weight row is a
// dot product, 8 lanes of k per register, and every input row needs its own x load next to each
// multiply-add (R + 1 loads for R multiply-adds): from about 3 rows on a step's products cost
// more than reading the weight does. Here a weight load serves up to 12 multiply-adds and a
// broadcast 2, so up to about 6 rows stay bound by reading the weight. Measured on an AVX2 EPYC
// (2 threads, the embedded model in float32, plain decoding, a step's forward and logits, both
// kernels in one process with their steps interleaved; docs/kernels.md has a second run): 1 / 3
// / 6 / 8 rows 16.0 / 18.6 / 23.1 / 27.0 ms with the row kernel, 15.8 / 17.1 / 20.4 / 26.1 with
// panels.
//
// The summation order, the same whatever the row count, the grouping or the thread count: each
// output is one chain of fused multiply-adds over k = 0 .. K-1 from 0 (partial sums that cross a
// block of k are stored and reloaded, exactly), then the bias is added. So a row's outputs are
// bit-identical alone and in a batch of any size, prefill chunks included. The portable build
// (no AVX2/FMA, or DRAFTGATE_PORTABLE) computes the same chains with std::fma, bit for bit.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#if defined(__AVX2__) && defined(__FMA__) && !defined(DRAFTGATE_PORTABLE)
#include <immintrin.h>
#define DRAFTGATE_PANEL_AVX2 1
#endif

namespace draftgate {
namespace {

constexpr int64_t kPanelWidth = 16;  // output channels a panel holds: two AVX2 registers
// Input rows one pass over a block of k takes: 6 rows x 2 registers = 12 accumulators, beside
// the 2 weight registers and the broadcast (15 of the 16 ymm registers).
constexpr int kMaxGroupRows = 6;
// k per block: a panel's block (8 KiB, 16 KiB for two panels) stays in L1 while the other row
// groups of a step re-read it. 64, 128, 256 and all of K measured alike.
constexpr int64_t kBlockK = 128;
constexpr int64_t kPrefetchFloats = 512;  // 2 KiB ahead in the panel's stream

#ifdef DRAFTGATE_PANEL_AVX2
// y[r][0 .. 16P) (+)= x[r][0 .. kc) against P panels `panel_stride` floats apart, for MR rows.
// kFirst: the block starts at k = 0 (the sums start from 0, not from y). kStream: the first row
// group over this block, which reads it from memory, prefetched a little ahead to pass the caches
// by (a decode step streams every weight once; kept, each line would go on into L3 and evict what
// the next kernel needs). The later groups find the block in L1 and meanwhile prefetch the next
// block, line for line, so that memory keeps streaming while they compute: without it a step of
// 7-8 rows cost a third more than one of 6 (two groups, the second one's time added whole to the
// stream's); with it 8 rows took 23.5 ms against 28.6 over the embedded model's linears, cycled
// from memory (AVX2 EPYC, 2 threads), 10-24 rows 10-17% less. (Beyond a panel's last block that
// is the next panel's first: prefetches never fault.)
template <int MR, int P, bool kFirst, bool kStream>
inline void panel_block(const float* x, int64_t x_stride, const float* w, int64_t panel_stride, int64_t kc, float* y,
                        int64_t y_stride) {
  __m256 acc[MR][2 * P];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) acc[r][v] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * y_stride + 8 * v);
  for (int64_t k = 0; k < kc; ++k) {
    __m256 wv[2 * P];
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const float* line = w + p * panel_stride + k * kPanelWidth;
      if (kStream) _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchFloats), _MM_HINT_NTA);
      else _mm_prefetch(reinterpret_cast<const char*>(line + kBlockK * kPanelWidth), _MM_HINT_T0);
      wv[2 * p] = _mm256_loadu_ps(line);
      wv[2 * p + 1] = _mm256_loadu_ps(line + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * x_stride + k);
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) acc[r][v] = _mm256_fmadd_ps(wv[v], xv, acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) _mm256_storeu_ps(y + r * y_stride + 8 * v, acc[r][v]);
}
#else
template <int MR, int P, bool kFirst, bool kStream>
inline void panel_block(const float* x, int64_t x_stride, const float* w, int64_t panel_stride, int64_t kc, float* y,
                        int64_t y_stride) {
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < P; ++p) {
      float* out = y + r * y_stride + p * kPanelWidth;
      const float* panel = w + p * panel_stride;
      for (int64_t j = 0; j < kPanelWidth; ++j) {
        float sum = kFirst ? 0.0f : out[j];
        for (int64_t k = 0; k < kc; ++k) sum = std::fma(panel[k * kPanelWidth + j], x[r * x_stride + k], sum);
        out[j] = sum;
      }
    }
}
#endif

// One block for `rows` rows (1 to the P's group size): the template for that row count. Kept out
// of line so each instance's accumulators get the whole register file.
template <int P, bool kFirst, bool kStream>
__attribute__((noinline)) void block_rows(int rows, const float* x, int64_t x_stride, const float* w,
                                          int64_t panel_stride, int64_t kc, float* y, int64_t y_stride) {
  if constexpr (P == 2) {  // groups of at most 3 rows: 12 accumulators
    switch (rows) {
      case 1: panel_block<1, 2, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      case 2: panel_block<2, 2, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      default: panel_block<3, 2, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
    }
  } else {
    switch (rows) {
      case 1: panel_block<1, 1, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      case 2: panel_block<2, 1, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      case 3: panel_block<3, 1, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      case 4: panel_block<4, 1, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      case 5: panel_block<5, 1, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
      default: panel_block<6, 1, kFirst, kStream>(x, x_stride, w, panel_stride, kc, y, y_stride); break;
    }
  }
}

// y[:, 0 .. 16P) for all M rows against P adjacent panels: block by block over k, and within a
// block the rows in balanced groups of at most group_rows (the first group streams the block in).
template <int P>
void panel_columns(const float* x, int64_t x_stride, const float* w, int64_t K, float* y, int64_t N, int64_t M,
                   int group_rows) {
  const int64_t panel_stride = K * kPanelWidth;
  const int64_t groups = (M + group_rows - 1) / group_rows;
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    const int64_t kc = std::min(kBlockK, K - k0);
    const float* wk = w + k0 * kPanelWidth;
    int64_t m = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int rows = static_cast<int>((M - m + (groups - g) - 1) / (groups - g));
      const float* xg = x + m * x_stride + k0;
      float* yg = y + m * N;
      if (k0 == 0 && g == 0) block_rows<P, true, true>(rows, xg, x_stride, wk, panel_stride, kc, yg, N);
      else if (k0 == 0) block_rows<P, true, false>(rows, xg, x_stride, wk, panel_stride, kc, yg, N);
      else if (g == 0) block_rows<P, false, true>(rows, xg, x_stride, wk, panel_stride, kc, yg, N);
      else block_rows<P, false, false>(rows, xg, x_stride, wk, panel_stride, kc, yg, N);
      m += rows;
    }
  }
}

// Panels taken two at a time: the row counts whose groups would otherwise leave too few
// accumulator chains for the multiply-add's 4-5 cycle latency (1-3 rows: 2-6 chains on one
// panel, 4-12 on two; 7-8 rows: groups of 4 on one panel, 8 chains each, against groups of 3 on
// two, 12). Measured in the forward at 1-3 rows, two panels against one: 14.9-16.8 against
// 16.8-18.0 ms.
inline bool two_panels(int64_t M) { return M <= 3 || M == 7 || M == 8; }

}  // namespace
}  // namespace draftgate

// x: [M, K] float32 rows `x_stride` floats apart; panels: [N / 16, K, 16] float32 contiguous (N a
// multiple of 16); bias: [N] float32 or null; y: [M, N] float32 contiguous. Returns 0, or 1 with
// a message in `error`.
extern "C" int draftgate_panel_linear(const float* x, int64_t x_stride, const float* panels, const float* bias,
                                      float* y, int64_t M, int64_t N, int64_t K, int32_t num_threads, char* error,
                                      int64_t error_len) {
  using namespace draftgate;
  if (M < 0 || N < 0 || K < 1 || N % kPanelWidth != 0 || (M > 1 && x_stride < K)) {
    std::snprintf(error, static_cast<size_t>(error_len),
                  "bad sizes M=%lld N=%lld K=%lld x_stride=%lld (N a multiple of %lld, K at least 1)",
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                  static_cast<long long>(x_stride), static_cast<long long>(kPanelWidth));
    return 1;
  }
  if (M == 0 || N == 0) return 0;
  const int64_t num_panels = N / kPanelWidth;
  const int P = two_panels(M) ? 2 : 1;
  const int group_rows = P == 2 ? 3 : kMaxGroupRows;
  const int64_t pairs = P == 2 ? num_panels / 2 : 0;
  // Work items: the pairs of panels, then the panels left one at a time.
  const int64_t items = pairs + (num_panels - 2 * pairs);
  // Below ~64K multiply-adds a thread team costs more than it saves.
  const int threads = M * N * K >= (int64_t(1) << 16) ? std::max(1, static_cast<int>(num_threads)) : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t panel = item < pairs ? 2 * item : 2 * pairs + (item - pairs);
    const float* w = panels + panel * K * kPanelWidth;
    float* y_cols = y + panel * kPanelWidth;
    if (item < pairs) panel_columns<2>(x, x_stride, w, K, y_cols, N, M, group_rows);
    else panel_columns<1>(x, x_stride, w, K, y_cols, N, M, kMaxGroupRows);
    if (bias != nullptr) {
      const int64_t width = (item < pairs ? 2 : 1) * kPanelWidth;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < width; ++j) y_cols[m * N + j] += bias[panel * kPanelWidth + j];
    }
  }
  return 0;
}
