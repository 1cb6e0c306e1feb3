// The per-chunk steps of the CPU paged attention (paged_attention.cpp): for one work item and
// one chunk of up to kKeyChunk keys, given row pointers into the cache, compute the scores of
// every query vector, take the online-softmax step, and add probabilities times values into the
// fp32 accumulators. Query vectors are rows of q / acc / probs (row m of an item: query
// m / group, query head m % group of the kv head).
//
// Templates: VT / CT is the cache element (float, or bf16_t widened on load); kNC is head_dim / 16
// when head_dim is 64 or 128 (rows live in registers), 0 for any other head_dim (a generic path
// that masks the last 16-lane part).
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec.h"

namespace draftgate {

constexpr int kKeyChunk = 32;  // keys per online-softmax update: two score vectors per query
constexpr int kRowPad = 6;     // score_transposed's tile height: q is padded to a multiple of it

// Register tiles. A Vec is one zmm with AVX-512 (32 registers) but two ymm with AVX2 (16), so the
// AVX-512 tiles (6 query vectors of accumulators: 24 Vecs in accumulate_tile at head_dim 64, 12
// in score_transposed) spilled on AVX2. There, accumulate_values takes one query vector at a time
// (its 4 Vecs of accumulators at head_dim 64, the value rows read from L1) and score_transposed 3
// (6 Vecs): bit-identical (each output's sum keeps its order), and on an AVX2 EPYC (2 threads,
// head_dim 64, 9 heads over 3 kv heads) 15-22% faster: one request verifying 5 tokens at 400 keys
// 92 us a layer against 108, 17 tokens at 800 keys 428 against 524, 8 one-token requests at 300
// keys 160 against 179, a 64-token prefill chunk 356 against 417.
// Query vectors per accumulate_tile (kNC Vecs of values and kNC per query vector in registers).
constexpr int value_tile_rows([[maybe_unused]] int kNC) {
#if defined(DRAFTGATE_AVX2)
  return 1;
#else
  return kNC <= 4 ? 6 : 2;
#endif
}
#if defined(DRAFTGATE_AVX2)
constexpr int kScoreTileRows = 3;  // divides kRowPad
#else
constexpr int kScoreTileRows = kRowPad;
#endif

// Part c (16 lanes) of a head_dim row; the last part of an odd head_dim is masked.
template <int kNC, typename T>
inline Vec load_part(const T* row, int c, int num_parts, int tail) {
  if (kNC > 0 || c + 1 < num_parts) return vload(row + c * kLanes);
  return vload(row + c * kLanes, tail);
}

// acc[m] = acc[m] * alpha[m] + sum_j probs[m][j] * V[j] for kRows query vectors m0.., their
// accumulators held in registers while the chunk's value rows stream past.
template <typename VT, int kNC, int kRows>
inline void accumulate_tile(const VT* const* value_rows, int num_keys, const float* probs, const float* alpha,
                            int64_t m0, float* acc) {
  constexpr int64_t dim = kNC * kLanes;
  Vec a[kRows][kNC];
  for (int r = 0; r < kRows; ++r) {
    const Vec scale = vset1(alpha[m0 + r]);
    for (int c = 0; c < kNC; ++c) a[r][c] = vmul(vload(acc + (m0 + r) * dim + c * kLanes), scale);
  }
  for (int j = 0; j < num_keys; ++j) {
    Vec v[kNC];
    for (int c = 0; c < kNC; ++c) v[c] = vload(value_rows[j] + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec weight = vset1(probs[(m0 + r) * kKeyChunk + j]);
      for (int c = 0; c < kNC; ++c) a[r][c] = vfma(weight, v[c], a[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kNC; ++c) vstore(acc + (m0 + r) * dim + c * kLanes, a[r][c]);
}

// The last tile, of `rows` < its full height: no work on padding rows (decode has 1-8 rows).
template <typename VT, int kNC, int kRows>
inline void accumulate_last_tile(int rows, const VT* const* value_rows, int num_keys, const float* probs,
                                 const float* alpha, int64_t m0, float* acc) {
  if constexpr (kRows > 0) {
    if (rows == kRows)
      accumulate_tile<VT, kNC, kRows>(value_rows, num_keys, probs, alpha, m0, acc);
    else
      accumulate_last_tile<VT, kNC, kRows - 1>(rows, value_rows, num_keys, probs, alpha, m0, acc);
  }
}

template <typename VT, int kNC>
inline void accumulate_values(int64_t head_dim, const VT* const* value_rows, int num_keys, const float* probs,
                              const float* alpha, int64_t num_rows, float* acc) {
  if constexpr (kNC > 0) {
    constexpr int kMR = value_tile_rows(kNC);
    int64_t m0 = 0;
    for (; m0 + kMR <= num_rows; m0 += kMR) accumulate_tile<VT, kNC, kMR>(value_rows, num_keys, probs, alpha, m0, acc);
    accumulate_last_tile<VT, kNC, kMR - 1>(static_cast<int>(num_rows - m0), value_rows, num_keys, probs, alpha, m0,
                                           acc);
  } else {
    const int num_parts = static_cast<int>((head_dim + kLanes - 1) / kLanes);
    const int64_t dim = int64_t(num_parts) * kLanes;
    const int tail = static_cast<int>(head_dim - (num_parts - 1) * kLanes);
    for (int64_t m = 0; m < num_rows; ++m) {
      float* row = acc + m * dim;
      const Vec scale = vset1(alpha[m]);
      for (int c = 0; c < num_parts; ++c) vstore(row + c * kLanes, vmul(vload(row + c * kLanes), scale));
      for (int j = 0; j < num_keys; ++j) {
        const float w = probs[m * kKeyChunk + j];
        if (w == 0.0f) continue;
        const Vec weight = vset1(w);
        for (int c = 0; c < num_parts; ++c)
          vstore(row + c * kLanes,
                 vfma(weight, load_part<0>(value_rows[j], c, num_parts, tail), vload(row + c * kLanes)));
      }
    }
  }
}

// Starts a key row and its value row (row_bytes each) on their way into cache.
template <typename CT>
inline void prefetch_rows(const CT* key_row, const CT* value_row, int64_t row_bytes) {
  for (int64_t byte = 0; byte < row_bytes; byte += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(key_row) + byte);
    __builtin_prefetch(reinterpret_cast<const char*>(value_row) + byte);
  }
}

// scores[m][j] = q[m] . key j, one key row at a time against every query vector: a horizontal
// sum per score, so used for one-tile queries (decode, verification), whose keys are read once.
// ahead: null, or rows (keys and values of the next chunk, 2 x kKeyChunk pointers, `num_ahead`
// of each, `row_bytes` long) to prefetch, ahead row j with key j: spread over the chunk rather
// than issued at once, which stalled on the core's outstanding-miss slots. A chunk with a next
// one is a full chunk, so num_ahead <= num_keys.
template <typename CT, int kNC>
inline void score_rows(const CT* const* key_rows, int num_keys, const float* q, int64_t num_rows, int num_parts,
                       int tail, float* scores, const CT* const* ahead = nullptr, int num_ahead = 0,
                       int64_t row_bytes = 0) {
  const int64_t dim = int64_t(num_parts) * kLanes;
  for (int j = 0; j < num_keys; ++j) {
    if (ahead != nullptr && j < num_ahead) prefetch_rows(ahead[j], ahead[kKeyChunk + j], row_bytes);
    if constexpr (kNC > 0) {
      Vec k[kNC];
      for (int c = 0; c < kNC; ++c) k[c] = vload(key_rows[j] + c * kLanes);
      for (int64_t m = 0; m < num_rows; ++m) {
        Vec s = vmul(k[0], vload(q + m * dim));
        for (int c = 1; c < kNC; ++c) s = vfma(k[c], vload(q + m * dim + c * kLanes), s);
        scores[m * kKeyChunk + j] = vsum(s);
      }
    } else {
      for (int64_t m = 0; m < num_rows; ++m) {
        Vec s = vzero();
        for (int c = 0; c < num_parts; ++c)
          s = vfma(load_part<0>(key_rows[j], c, num_parts, tail), vload(q + m * dim + c * kLanes), s);
        scores[m * kKeyChunk + j] = vsum(s);
      }
    }
  }
}

// The same scores as outer products: the chunk's keys are transposed once ([dim, kKeyChunk]),
// then each query element, broadcast, multiplies a row of 16 keys. No horizontal sums, so this
// wins once the transpose is shared by enough query vectors (prefill, verification, wide GQA).
template <typename CT, int kNC>
inline void score_transposed(const CT* const* key_rows, int num_keys, const float* q, int64_t num_rows,
                             float* key_t, float* scores) {
  static_assert(kNC > 0 && kKeyChunk == 2 * kLanes);
  constexpr int64_t dim = kNC * kLanes;
  constexpr int kRows = kScoreTileRows;  // query vectors per register tile: 2 * kRows accumulators
  const bool two_halves = num_keys > kLanes;
  for (int half = 0; half < (two_halves ? 2 : 1); ++half)
    for (int c = 0; c < kNC; ++c) {
      Vec rows[kLanes];
      for (int i = 0; i < kLanes; ++i) {
        const int j = half * kLanes + i;
        rows[i] = j < num_keys ? vload(key_rows[j] + c * kLanes) : vzero();
      }
      transpose16x16(rows, key_t + c * kLanes * kKeyChunk + half * kLanes, kKeyChunk);
    }
  for (int64_t m0 = 0; m0 < num_rows; m0 += kRows) {
    Vec a0[kRows], a1[kRows];
    for (int r = 0; r < kRows; ++r) a0[r] = a1[r] = vzero();
    if (two_halves) {
      for (int64_t d = 0; d < dim; ++d) {
        const Vec k0 = vload(key_t + d * kKeyChunk), k1 = vload(key_t + d * kKeyChunk + kLanes);
        for (int r = 0; r < kRows; ++r) {
          const Vec x = vset1(q[(m0 + r) * dim + d]);
          a0[r] = vfma(x, k0, a0[r]);
          a1[r] = vfma(x, k1, a1[r]);
        }
      }
    } else {
      for (int64_t d = 0; d < dim; ++d) {
        const Vec k0 = vload(key_t + d * kKeyChunk);
        for (int r = 0; r < kRows; ++r) a0[r] = vfma(vset1(q[(m0 + r) * dim + d]), k0, a0[r]);
      }
    }
    // Padding rows' scores are not stored: their probabilities must stay 0.
    for (int r = 0; r < kRows && m0 + r < num_rows; ++r) {
      vstore(scores + (m0 + r) * kKeyChunk, a0[r]);
      vstore(scores + (m0 + r) * kKeyChunk + kLanes, a1[r]);
    }
  }
}

// The online-softmax step for one chunk of keys, given its raw scores (probs, [rows, kKeyChunk]):
// masks the keys each query may not see, advances the running max, sets alpha (how much the
// old accumulator and sum shrink), turns scores into probabilities and adds them to the
// lane-wise running sums. Three passes so that the rescale factors come out 16 rows per exp.
// Query vector m belongs to the query at position first_position + m / group.
inline void online_softmax(int64_t c0, int num_keys, int64_t first_position, int64_t group, int64_t sliding_window,
                           int64_t num_rows, float* probs, float* running_max, float* chunk_max, float* alpha,
                           float* sums) {
  const auto visible = [&](int64_t m, int& lo, int& hi) {
    const int64_t position = first_position + m / group;
    const int64_t oldest = sliding_window > 0 ? position - sliding_window + 1 : 0;
    lo = static_cast<int>(std::max<int64_t>(oldest - c0, 0));
    hi = static_cast<int>(std::min<int64_t>(position + 1 - c0, num_keys));
    return lo < hi;
  };
  for (int64_t m = 0; m < num_rows; ++m) {
    int lo, hi;
    chunk_max[m] = running_max[m];
    if (!visible(m, lo, hi)) continue;
    float* row = probs + m * kKeyChunk;
    Vec s0 = vload(row), s1 = vload(row + kLanes);
    if (lo > 0 || hi < kKeyChunk) {  // a diagonal, window edge or last chunk: mask, keep masked
      s0 = vkeep_range(s0, lo, hi);
      s1 = vkeep_range(s1, lo - kLanes, hi - kLanes);
      vstore(row, s0);
      vstore(row + kLanes, s1);
    }
    chunk_max[m] = std::max(chunk_max[m], vmaxall(vmax(s0, s1)));
  }
  // exp(-inf - -inf) is NaN, which vexp turns into 0: a row that has seen nothing yet keeps a
  // zero accumulator and sum either way.
  for (int64_t m = 0; m < num_rows; m += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, num_rows - m));
    const Vec new_max = vload(chunk_max + m, n);
    vstore(alpha + m, vexp(vsub(vload(running_max + m, n), new_max)), n);
    vstore(running_max + m, new_max, n);
  }
  for (int64_t m = 0; m < num_rows; ++m) {
    int lo, hi;
    float* row = probs + m * kKeyChunk;
    if (!visible(m, lo, hi)) {
      std::fill(row, row + kKeyChunk, 0.0f);
      continue;
    }
    const Vec shift = vset1(running_max[m]);
    const Vec p0 = vexp(vsub(vload(row), shift)), p1 = vexp(vsub(vload(row + kLanes), shift));
    vstore(row, p0);
    vstore(row + kLanes, p1);
    float* sum = sums + m * kLanes;
    vstore(sum, vfma(vload(sum), vset1(alpha[m]), vadd(p0, p1)));
  }
}

}  // namespace draftgate
