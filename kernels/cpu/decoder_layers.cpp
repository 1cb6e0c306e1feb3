// A few-row step through a stack of Llama-family decoder layers in one call, on CPUs: the
// decode and verification steps of a float32 model whose few-row products take the compiled
// kernel (AVX2 CPUs, kernels/small_rows_linear.py), and an EAGLE head's one-layer passes.
//
// Why: the same step driven layer by layer from Python makes ~9 kernel calls a layer, each with
// its module calls, checks, output tensors and ctypes argument conversion, plus the rotary
// embedding as six tensor ops. On the embedded model (30 layers, 2 threads, an AVX2 EPYC) a
// one-token step spent 20 ms inside the compiled kernels and 11 ms outside them. Here every
// layer calls the very same kernels (their C entry points, in the same order, on the same
// inputs), so the result is bit-identical to the Python path's (tests/engine/model/
// test_fused_decoder.py); only the glue is gone.
//
// Per layer, as engine/model/llama.py's LlamaDecoderLayer does: input RMSNorm (the first layer
// without a residual, the others fused with the residual add), the fused q/k/v projection, the
// rotary embedding of q and k (rotate-half form, computed exactly as torch computes
// x1 * cos - x2 * sin and x2 * cos + x1 * sin: each product and sum rounded on its own), the KV
// store, paged attention, the output projection, the post-attention RMSNorm fused with the
// residual add, gate/up, SwiGLU and down; after the last layer the final norm with the residual.
// Qwen3's per-head q/k norms are not covered (the Python path keeps those models).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "skinny_entry.h"  // the few-row products, linear()
#include "vec.h"  // at_least

namespace {

enum DType : int64_t { kFloat32 = 0 };  // the activations' dtype code (norms, KV store, attention)

}  // namespace

// The compiled kernels' C entry points (the other sources of this library).
extern "C" {
int draftgate_rms_norm(const void* x, int64_t x_stride, const void* residual, int64_t residual_stride,
                       const void* weight, void* out, void* residual_out, int32_t dtype, int64_t rows, int64_t hidden,
                       double eps, int32_t num_threads, char* error, int64_t error_len);
int draftgate_silu_mul(const void* gate_up, int64_t stride, void* out, int32_t dtype, int64_t rows, int64_t d,
                       int32_t num_threads, char* error, int64_t error_len);
int draftgate_store_kv(const void* key, int32_t key_dtype, int64_t key_token_stride, int64_t key_head_stride,
                       const void* value, int32_t value_dtype, int64_t value_token_stride, int64_t value_head_stride,
                       void* k_cache, void* v_cache, int32_t cache_dtype, const int64_t* slot_mapping,
                       int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                       int64_t block_size, char* error, int64_t error_len);
int draftgate_paged_attention(const void* query, int32_t query_dtype, int64_t query_token_stride,
                              int64_t query_head_stride, const void* k_cache, const void* v_cache, int32_t cache_dtype,
                              void* out, const int32_t* block_table, int64_t block_table_stride,
                              int64_t max_blocks_per_req, const int32_t* query_start_loc, const int32_t* seq_lens,
                              int64_t num_reqs, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                              int64_t head_dim, int64_t num_blocks, int64_t block_size, double scale,
                              int64_t sliding_window, int32_t num_threads, char* error, int64_t error_len);
}

// One layer's tensors (kernels/cpu/library.py's DecoderLayerWeights mirrors it: every field 8
// bytes, so the two layouts cannot disagree on padding). Linear weights are [N, K] contiguous,
// float32, bf16 (widened as read, exactly) or int8 with float32 scales [N] (null for the others),
// or float32 in panels [N / 16, K, 16] (panel_linear.cpp); the *_dtype fields say which; biases float32 or null; norms float32 [hidden]; the caches float32 [num_blocks, num_kv_heads,
// block_size, head_dim].
struct DecoderLayerWeights {
  const float* input_norm;
  const float* post_norm;
  const void* qkv;
  const float* qkv_bias;
  int64_t qkv_dtype;
  const void* o;
  const float* o_bias;
  int64_t o_dtype;
  const void* gate_up;
  const float* gate_up_bias;
  int64_t gate_up_dtype;
  const void* down;
  const float* down_bias;
  int64_t down_dtype;
  void* k_cache;
  void* v_cache;
  int64_t sliding_window;  // 0: none
  const float* qkv_scales;
  const float* o_scales;
  const float* gate_up_scales;
  const float* down_scales;
};

namespace {

using draftgate::linear;

// qk[t, h] = rotate(qkv[t, h]) for the num_heads + num_kv_heads heads of q and k: with x1, x2 a
// head's halves, (x1 cos - x2 sin, x2 cos + x1 sin). No contraction into fused multiply-adds, so
// each product and each sum is rounded as torch's separate tensor ops round them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void rotate(const float* qkv, int64_t qkv_stride, const float* cos_sin, int64_t num_tokens, int64_t num_heads,
            int64_t head_dim, float* qk) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* cos = cos_sin + t * head_dim;
    const float* sin = cos + half;
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* x = qkv + t * qkv_stride + h * head_dim;
      float* out = qk + (t * num_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[half + i];
        const float a = x1 * cos[i], b = x2 * sin[i];
        const float c = x2 * cos[i], d = x1 * sin[i];
        out[i] = a - b;
        out[half + i] = c + d;
      }
    }
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace

// hidden_in: [num_tokens, hidden] float32, the first layer's input (embeddings, or an EAGLE
// head's fc output); cos_sin: [num_tokens, head_dim] float32, each token's rotary table row
// (cos in the first half, sin in the second); slot_mapping [num_tokens] int64; block_table
// [num_reqs, >= max_blocks_per_req] int32 rows block_table_stride apart; query_start_loc
// [num_reqs + 1] and seq_lens [num_reqs] int32, as kernels.paged_attention takes them;
// final_norm [hidden]; out: [num_tokens, hidden] float32, the final norm's output. num_tokens
// must be within what the few-row kernel takes (the caller checks). Returns 0, or 1 with a
// message in `error`.
extern "C" int draftgate_decoder_layers(
    const DecoderLayerWeights* layers, int64_t num_layers, const float* final_norm, const float* hidden_in,
    const float* cos_sin, const int64_t* slot_mapping, const int32_t* block_table, int64_t block_table_stride,
    int64_t max_blocks_per_req, const int32_t* query_start_loc, const int32_t* seq_lens, int64_t num_reqs,
    int64_t num_tokens, int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    int64_t intermediate, int64_t num_blocks, int64_t block_size, double scale, double eps, int32_t num_threads,
    float* out, char* error, int64_t error_len) {
  if (num_layers < 1 || num_tokens < 1 || hidden < 1 || num_heads < 1 || num_kv_heads < 1 || head_dim < 2 ||
      head_dim % 2 != 0 || intermediate < 1) {
    std::snprintf(error, static_cast<size_t>(error_len),
                  "bad sizes: layers %lld tokens %lld hidden %lld heads %lld/%lld head_dim %lld intermediate %lld",
                  static_cast<long long>(num_layers), static_cast<long long>(num_tokens),
                  static_cast<long long>(hidden), static_cast<long long>(num_heads),
                  static_cast<long long>(num_kv_heads), static_cast<long long>(head_dim),
                  static_cast<long long>(intermediate));
    return 1;
  }
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  const int64_t qkv_width = q_size + 2 * kv_size, qk_heads = num_heads + num_kv_heads;
  // Scratch for the layer's activations, [num_tokens, width] each: one buffer per calling thread,
  // kept between calls (a step's ~2 MB at 40 rows would otherwise be mapped, zeroed and
  // unmapped again every step).
  thread_local std::vector<float> kept;
  const int64_t widths[] = {hidden, hidden, hidden, hidden, qkv_width, qk_heads * head_dim, q_size,
                            2 * intermediate, intermediate};
  int64_t total = 0;
  for (int64_t width : widths) total += num_tokens * width;
  float* parts[9];
  float* next = draftgate::at_least(kept, static_cast<size_t>(total));
  for (int i = 0; i < 9; ++i) {
    parts[i] = next;
    next += num_tokens * widths[i];
  }
  float *residual = parts[0], *residual_next = parts[1], *normed = parts[2], *x = parts[3], *qkv = parts[4],
        *qk = parts[5], *attended = parts[6], *gate_up = parts[7], *act = parts[8];
  const int64_t head_stride = head_dim;

  for (int64_t l = 0; l < num_layers; ++l) {
    const DecoderLayerWeights& w = layers[l];
    int status;
    if (l == 0) {
      // No residual before the first layer: it is the input itself.
      std::copy(hidden_in, hidden_in + num_tokens * hidden, residual);
      status = draftgate_rms_norm(hidden_in, hidden, nullptr, 0, w.input_norm, normed, nullptr, kFloat32,
                                  num_tokens, hidden, eps, num_threads, error, error_len);
    } else {
      status = draftgate_rms_norm(x, hidden, residual, hidden, w.input_norm, normed,
                                  residual_next, kFloat32, num_tokens, hidden, eps, num_threads, error,
                                  error_len);
      std::swap(residual, residual_next);
    }
    if (status == 0)
      status = linear(normed, w.qkv, w.qkv_dtype, w.qkv_scales, w.qkv_bias, qkv, num_tokens, qkv_width, hidden,
                      num_threads, error, error_len);
    if (status == 0) {
      rotate(qkv, qkv_width, cos_sin, num_tokens, qk_heads, head_dim, qk);
      status = draftgate_store_kv(qk + q_size, kFloat32, qk_heads * head_dim, head_stride,
                                  qkv + q_size + kv_size, kFloat32, qkv_width, head_stride, w.k_cache,
                                  w.v_cache, kFloat32, slot_mapping, num_tokens, num_kv_heads, head_dim, num_blocks,
                                  block_size, error, error_len);
    }
    if (status == 0)
      status = draftgate_paged_attention(qk, kFloat32, qk_heads * head_dim, head_stride, w.k_cache, w.v_cache,
                                         kFloat32, attended, block_table, block_table_stride,
                                         max_blocks_per_req, query_start_loc, seq_lens, num_reqs, num_tokens,
                                         num_heads, num_kv_heads, head_dim, num_blocks, block_size, scale,
                                         w.sliding_window, num_threads, error, error_len);
    if (status == 0)
      status = linear(attended, w.o, w.o_dtype, w.o_scales, w.o_bias, x, num_tokens, hidden, q_size, num_threads,
                      error, error_len);
    if (status == 0) {
      status = draftgate_rms_norm(x, hidden, residual, hidden, w.post_norm, normed,
                                  residual_next, kFloat32, num_tokens, hidden, eps, num_threads, error,
                                  error_len);
      std::swap(residual, residual_next);
    }
    if (status == 0)
      status = linear(normed, w.gate_up, w.gate_up_dtype, w.gate_up_scales, w.gate_up_bias, gate_up, num_tokens,
                      2 * intermediate, hidden, num_threads, error, error_len);
    if (status == 0)
      status = draftgate_silu_mul(gate_up, 2 * intermediate, act, kFloat32, num_tokens, intermediate,
                                  num_threads, error, error_len);
    if (status == 0)
      status = linear(act, w.down, w.down_dtype, w.down_scales, w.down_bias, x, num_tokens, hidden, intermediate,
                      num_threads, error, error_len);
    if (status != 0) {
      // Keep the kernel's message, say which layer.
      std::vector<char> message(error, error + error_len);
      std::snprintf(error, static_cast<size_t>(error_len), "layer %lld: %s", static_cast<long long>(l),
                    message.data());
      return 1;
    }
  }
  return draftgate_rms_norm(x, hidden, residual, hidden, final_norm, out, residual_next, kFloat32,
                            num_tokens, hidden, eps, num_threads, error, error_len);
}
