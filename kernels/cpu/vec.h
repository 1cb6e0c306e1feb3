// 16-lane float vectors for the CPU kernels: AVX-512 intrinsics where the compiler targets
// AVX-512 (-march=native on this project's CPUs), plain loops elsewhere (the compiler vectorizes
// them for AVX2). The kernels are written once against this small set of operations.
//
// bf16 values travel as uint16_t bit patterns: widening is a 16-bit shift, narrowing rounds to
// nearest even (what torch's float -> bfloat16 conversion does).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(DRAFTGATE_PORTABLE)
#include <immintrin.h>
#define DRAFTGATE_AVX512 1
#endif

namespace draftgate {

constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// e^x underflows below this; such lanes (and -inf, i.e. masked keys) become exactly 0.
constexpr float kExpCutoff = -87.0f;

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

// e^x with about 1 ulp of error (Cephes' single-precision polynomial after a two-part ln 2
// range reduction); lanes below kExpCutoff, -inf and NaN give 0.
inline Vec vexp(Vec x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kExpCutoff), _CMP_GT_OQ);
  __m512 y = _mm512_min_ps(x.v, _mm512_set1_ps(88.3762626647949f));
  y = _mm512_max_ps(y, _mm512_set1_ps(kExpCutoff));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), y);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
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
