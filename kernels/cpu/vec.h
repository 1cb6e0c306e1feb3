// 16-lane float vectors for the CPU kernels: AVX-512 intrinsics where the compiler targets
// AVX-512, pairs of AVX2 registers where it targets AVX2 and FMA (-march=native picks; the
// project's CPUs have been both), plain loops elsewhere. The kernels are written once against
// this small set of operations.
//
// The AVX2 path exists because the plain loops, though the compiler vectorizes their lane-wise
// arithmetic, leave e^x to scalar std::exp calls and every horizontal sum to a sequential loop:
// on an AVX2 EPYC a SwiGLU activation of 15 rows took 200 us, and the norms, activations and
// attention together grew a one-stream decode step by 3.7 ms from 1 token to 5 (of 4.9 ms).
//
// bf16 values travel as uint16_t bit patterns: widening is a 16-bit shift, narrowing rounds to
// nearest even (what torch's float -> bfloat16 conversion does).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(DRAFTGATE_PORTABLE)
#include <immintrin.h>
#define DRAFTGATE_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && !defined(DRAFTGATE_PORTABLE)
#include <immintrin.h>
#define DRAFTGATE_AVX2 1
#endif

namespace draftgate {

// At least n floats of `buffer`, a thread_local one kept between calls (grown, never shrunk):
// per-call scratch without allocating and zeroing it every call. Its values are whatever an
// earlier call left, so callers write before they read.
inline float* at_least(std::vector<float>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// e^x underflows below this; such lanes (and -inf, i.e. masked keys) become exactly 0.
constexpr float kExpCutoff = -87.0f;
// e^x on the vector paths: Cephes' single-precision polynomial (about 1 ulp) after a two-part
// ln 2 range reduction; above kExpMax e^x overflows.
constexpr float kExpMax = 88.3762626647949f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

using bf16_t = uint16_t;

inline float bf16_to_float(bf16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline bf16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_t>(bits >> 16);
}

inline float to_float(float x) { return x; }
inline float to_float(bf16_t x) { return bf16_to_float(x); }
inline float to_float(int8_t x) { return static_cast<float>(x); }  // int8 weights (skinny_linear.cpp)
inline void from_float(float x, float* dst) { *dst = x; }
inline void from_float(float x, bf16_t* dst) { *dst = float_to_bf16(x); }

#ifdef DRAFTGATE_AVX512

struct Vec {
  __m512 v;
};

// Lanes 0..n-1 (n may be out of 0..16: clamped).
inline __mmask16 lanes_below(int n) {
  return n <= 0 ? __mmask16(0) : n >= kLanes ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
}
inline Vec vzero() { return {_mm512_setzero_ps()}; }
inline Vec vset1(float x) { return {_mm512_set1_ps(x)}; }
inline Vec vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vec vload(const float* p, int n) { return {_mm512_maskz_loadu_ps(lanes_below(n), p)}; }
inline Vec widen(__m256i h) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))}; }
inline Vec vload(const bf16_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline Vec vload(const bf16_t* p, int n) { return widen(_mm256_maskz_loadu_epi16(lanes_below(n), p)); }
inline void vstore(float* p, Vec a) { _mm512_storeu_ps(p, a.v); }
inline void vstore(float* p, Vec a, int n) { _mm512_mask_storeu_ps(p, lanes_below(n), a.v); }
// Each lane rounded to the nearest bf16 (ties to even; NaN stays NaN), still as a float.
inline __m512i round_bf16_bits(__m512 a) {
  const __m512i bits = _mm512_castps_si512(a);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(bits, _mm512_set1_epi32(0x400000)));
}
inline Vec vround_bf16(Vec a) {
  return {_mm512_castsi512_ps(_mm512_and_si512(round_bf16_bits(a.v), _mm512_set1_epi32(int32_t(0xffff0000u))))};
}
inline void vstore(bf16_t* p, Vec a, int n = kLanes) {
  const __m256i halves = _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16_bits(a.v), 16));
  _mm256_mask_storeu_epi16(p, lanes_below(n), halves);
}
inline Vec vadd(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec vsub(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec vmul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec vdiv(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c
inline Vec vmax(Vec a, Vec b) { return {_mm512_max_ps(a.v, b.v)}; }
inline float vsum(Vec a) { return _mm512_reduce_add_ps(a.v); }
inline float vmaxall(Vec a) { return _mm512_reduce_max_ps(a.v); }

// Lanes outside [lo, hi) set to -inf (keys a query may not see).
inline Vec vkeep_range(Vec a, int lo, int hi) {
  const __mmask16 keep = static_cast<__mmask16>(lanes_below(hi) & ~lanes_below(lo));
  return {_mm512_mask_blend_ps(keep, _mm512_set1_ps(kNegInf), a.v)};
}

// e^x (kExpPoly); lanes below kExpCutoff, -inf and NaN give 0.
inline Vec vexp(Vec x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kExpCutoff), _CMP_GT_OQ);
  __m512 y = _mm512_min_ps(x.v, _mm512_set1_ps(kExpMax));
  y = _mm512_max_ps(y, _mm512_set1_ps(kExpCutoff));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), y);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return {_mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n))};
}

// dst[i * stride + j] = rows[j][i] for a 16x16 block (rows are overwritten). Three rounds of
// shuffles: pairs of floats, pairs of doubles, then 128-bit lanes across four registers.
inline void transpose16x16(Vec* rows, float* dst, int64_t stride) {
  __m512 t[16], r[16];
  for (int i = 0; i < 16; ++i) r[i] = rows[i].v;
  for (int p = 0; p < 8; ++p) {
    t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  // r[4q + c], 128-bit lane L: column 4L + c of rows 4q..4q+3.
  for (int q = 0; q < 4; ++q) {
    const __m512d a = _mm512_castps_pd(t[4 * q]), b = _mm512_castps_pd(t[4 * q + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * q + 2]), d = _mm512_castps_pd(t[4 * q + 3]);
    r[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xee);
    const __m512 y0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xee);
    _mm512_storeu_ps(dst + c * stride, _mm512_shuffle_f32x4(x0, y0, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * stride, _mm512_shuffle_f32x4(x0, y0, 0xdd));
    _mm512_storeu_ps(dst + (8 + c) * stride, _mm512_shuffle_f32x4(x1, y1, 0x88));
    _mm512_storeu_ps(dst + (12 + c) * stride, _mm512_shuffle_f32x4(x1, y1, 0xdd));
  }
}

#elif defined(DRAFTGATE_AVX2)

// Lanes 0-7 in lo, 8-15 in hi.
struct Vec {
  __m256 lo, hi;
};

// All-ones 32-bit lanes for lanes [first, first + 8) that are below n.
inline __m256i lanes_below8(int n, int first) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - first), index);
}
inline Vec vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline Vec vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
// Masked loads read nothing outside lanes 0..n-1 (no fault past the end of a row).
inline Vec vload(const float* p, int n) {
  if (n >= kLanes) return vload(p);
  return {_mm256_maskload_ps(p, lanes_below8(n, 0)), _mm256_maskload_ps(p + 8, lanes_below8(n, 8))};
}
inline __m256 widen8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
inline Vec vload(const bf16_t* p) {
  return {widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline Vec vload(const bf16_t* p, int n) {
  if (n >= kLanes) return vload(p);
  alignas(32) bf16_t part[kLanes] = {};
  for (int i = 0; i < n; ++i) part[i] = p[i];
  return vload(part);
}
inline void vstore(float* p, Vec a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline void vstore(float* p, Vec a, int n) {
  if (n >= kLanes) return vstore(p, a);
  _mm256_maskstore_ps(p, lanes_below8(n, 0), a.lo);
  _mm256_maskstore_ps(p + 8, lanes_below8(n, 8), a.hi);
}
// Each lane rounded to the nearest bf16 (ties to even; NaN stays NaN), as float bits.
inline __m256i round_bf16_bits(__m256 a) {
  const __m256i bits = _mm256_castps_si256(a);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256 nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
  const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
}
inline Vec vround_bf16(Vec a) {
  const __m256i high = _mm256_set1_epi32(int32_t(0xffff0000u));
  return {_mm256_castsi256_ps(_mm256_and_si256(round_bf16_bits(a.lo), high)),
          _mm256_castsi256_ps(_mm256_and_si256(round_bf16_bits(a.hi), high))};
}
inline void vstore(bf16_t* p, Vec a, int n = kLanes) {
  const __m256i lo = _mm256_srli_epi32(round_bf16_bits(a.lo), 16), hi = _mm256_srli_epi32(round_bf16_bits(a.hi), 16);
  // packus works within 128-bit halves (lo0-3 hi0-3 lo4-7 hi4-7): the permute restores the order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
  if (n >= kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
    return;
  }
  alignas(32) bf16_t part[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(part), packed);
  for (int i = 0; i < n; ++i) p[i] = part[i];
}
#define DRAFTGATE_PAIRWISE(name, op) \
  inline Vec name(Vec a, Vec b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
DRAFTGATE_PAIRWISE(vadd, _mm256_add_ps)
DRAFTGATE_PAIRWISE(vsub, _mm256_sub_ps)
DRAFTGATE_PAIRWISE(vmul, _mm256_mul_ps)
DRAFTGATE_PAIRWISE(vdiv, _mm256_div_ps)
DRAFTGATE_PAIRWISE(vmax, _mm256_max_ps)
#undef DRAFTGATE_PAIRWISE
inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline float vsum(Vec a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vmaxall(Vec a) {
  const __m256 m8 = _mm256_max_ps(a.lo, a.hi);
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline Vec vkeep_range(Vec a, int lo, int hi) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256 keep_lo = _mm256_castsi256_ps(_mm256_andnot_si256(lanes_below8(lo, 0), lanes_below8(hi, 0)));
  const __m256 keep_hi = _mm256_castsi256_ps(_mm256_andnot_si256(lanes_below8(lo, 8), lanes_below8(hi, 8)));
  return {_mm256_blendv_ps(neg_inf, a.lo, keep_lo), _mm256_blendv_ps(neg_inf, a.hi, keep_hi)};
}
// The AVX-512 path's e^x on 8 lanes. 2^n is applied as two factors 2^(n >> 1) and 2^(n - (n >> 1)),
// both normal floats for every n in [-126, 128] (scalef's job there).
inline __m256 vexp8(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(kExpCutoff), _CMP_GT_OQ);
  __m256 y = _mm256_min_ps(x, _mm256_set1_ps(kExpMax));
  y = _mm256_max_ps(y, _mm256_set1_ps(kExpCutoff));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), y);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, f1), f2), live);
}
inline Vec vexp(Vec x) { return {vexp8(x.lo), vexp8(x.hi)}; }

// dst[i * stride + j] = src[j][i] for an 8x8 block of registers.
inline void transpose8x8(const __m256* src, float* dst, int64_t stride) {
  __m256 t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(src[2 * p], src[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(src[2 * p], src[2 * p + 1]);
  }
  for (int q = 0; q < 2; ++q) {
    u[4 * q] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
    u[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xee);
    u[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
    u[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * stride, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
    _mm256_storeu_ps(dst + (4 + c) * stride, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
  }
}
inline void transpose16x16(Vec* rows, float* dst, int64_t stride) {
  __m256 block[8];
  for (int half_in = 0; half_in < 2; ++half_in)  // rows 0-7, then 8-15: dst columns
    for (int half_out = 0; half_out < 2; ++half_out) {  // lanes 0-7, then 8-15: dst rows
      for (int j = 0; j < 8; ++j) block[j] = half_out == 0 ? rows[8 * half_in + j].lo : rows[8 * half_in + j].hi;
      transpose8x8(block, dst + 8 * half_out * stride + 8 * half_in, stride);
    }
}

#else  // portable

struct Vec {
  float v[kLanes];
};

inline Vec vset1(float x) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = x;
  return r;
}
inline Vec vzero() { return vset1(0.0f); }
template <typename T>
inline Vec vload(const T* p, int n = kLanes) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = i < n ? to_float(p[i]) : 0.0f;
  return r;
}
inline void vstore(float* p, Vec a, int n = kLanes) {
  for (int i = 0; i < n && i < kLanes; ++i) p[i] = a.v[i];
}
inline Vec vround_bf16(Vec a) {
  for (int i = 0; i < kLanes; ++i) a.v[i] = bf16_to_float(float_to_bf16(a.v[i]));
  return a;
}
inline void vstore(bf16_t* p, Vec a, int n = kLanes) {
  for (int i = 0; i < n && i < kLanes; ++i) p[i] = float_to_bf16(a.v[i]);
}
#define DRAFTGATE_LANEWISE(name, expr)          \
  inline Vec name(Vec a, Vec b) {               \
    Vec r;                                      \
    for (int i = 0; i < kLanes; ++i) r.v[i] = expr; \
    return r;                                   \
  }
DRAFTGATE_LANEWISE(vadd, a.v[i] + b.v[i])
DRAFTGATE_LANEWISE(vsub, a.v[i] - b.v[i])
DRAFTGATE_LANEWISE(vmul, a.v[i] * b.v[i])
DRAFTGATE_LANEWISE(vdiv, a.v[i] / b.v[i])
DRAFTGATE_LANEWISE(vmax, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef DRAFTGATE_LANEWISE
inline Vec vfma(Vec a, Vec b, Vec c) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return r;
}
inline float vsum(Vec a) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += a.v[i];
  return s;
}
inline float vmaxall(Vec a) {
  float m = kNegInf;
  for (int i = 0; i < kLanes; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
inline Vec vkeep_range(Vec a, int lo, int hi) {
  for (int i = 0; i < kLanes; ++i)
    if (i < lo || i >= hi) a.v[i] = kNegInf;
  return a;
}
inline Vec vexp(Vec x) {
  for (int i = 0; i < kLanes; ++i) x.v[i] = x.v[i] > kExpCutoff ? std::exp(x.v[i]) : 0.0f;
  return x;
}
inline void transpose16x16(Vec* rows, float* dst, int64_t stride) {
  for (int i = 0; i < kLanes; ++i)
    for (int j = 0; j < kLanes; ++j) dst[i * stride + j] = rows[j].v[i];
}

#endif

// Each lane rounded to what storing it as T and reading it back gives (T chosen by a pointer's type).
inline Vec vround_to(Vec a, const float*) { return a; }
inline Vec vround_to(Vec a, const bf16_t*) { return vround_bf16(a); }

}  // namespace draftgate
