// An EAGLE head's position in one call, and a draft's greedy token with its probability, on CPUs
// where the head's layer takes the one-call decoder stack (float32 drafts on AVX2 CPUs;
// engine/spec_decode/eagle.py).
//
// Why: the head drafts position by position, and driven from Python each position paid for the
// embedding lookup, the concatenation with the target's state, the fc product, the layer's call,
// then the output head's product, a softmax, its maximum, the argmax and the map to target token
// ids: ~10 tensor ops and 3 ctypes calls, ~0.2 ms of a ~0.5 ms position on an AVX2 EPYC
// (2 threads, one stream, the shipped head with int8-held weights), where the kernels took the
// rest. Here the same kernels run on the same inputs through their C entry points, so the
// predicted states and the logits are the Python path's bit for bit (tests/kernels/
// test_eagle_head.py); the probability is summed here, in a fixed order of its own, and may
// differ from torch's softmax in its last bits (it only prices the draft).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "skinny_entry.h"  // the few-row products, linear()
#include "vec.h"  // at_least, the 16-lane e^x

extern "C" {
struct DecoderLayerWeights;  // decoder_layers.cpp's; only passed through
int draftgate_decoder_layers(const DecoderLayerWeights* layers, int64_t num_layers, const float* final_norm,
                             const float* hidden_in, const float* cos_sin, const int64_t* slot_mapping,
                             const int32_t* block_table, int64_t block_table_stride, int64_t max_blocks_per_req,
                             const int32_t* query_start_loc, const int32_t* seq_lens, int64_t num_reqs,
                             int64_t num_tokens, int64_t hidden, int64_t num_heads, int64_t num_kv_heads,
                             int64_t head_dim, int64_t intermediate, int64_t num_blocks, int64_t block_size,
                             double scale, double eps, int32_t num_threads, float* out, char* error,
                             int64_t error_len);
}

// out [num_tokens, hidden] = the head's layer and final norm over fc([embedding[token_ids];
// states]): token_ids [num_tokens] int64 (each position's next token), embedding [vocab, hidden]
// float32, states [num_tokens, hidden] float32 rows states_stride apart (the target's states),
// fc [hidden, 2 * hidden] held as fc_dtype (fc_scales for int8); cos_sin_table [max_positions,
// head_dim] and positions [num_tokens] int64; the layer (one DecoderLayerWeights, its KV caches
// included), final_norm and the attention metadata as draftgate_decoder_layers takes them.
extern "C" int draftgate_eagle_forward(
    const int64_t* token_ids, const float* embedding, int64_t vocab_size, const float* states, int64_t states_stride,
    const void* fc_weight, int64_t fc_dtype, const float* fc_scales, const DecoderLayerWeights* layer,
    const float* final_norm, const float* cos_sin_table, int64_t max_positions, const int64_t* positions,
    const int64_t* slot_mapping, const int32_t* block_table, int64_t block_table_stride, int64_t max_blocks_per_req,
    const int32_t* query_start_loc, const int32_t* seq_lens, int64_t num_reqs, int64_t num_tokens, int64_t hidden,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t intermediate, int64_t num_blocks,
    int64_t block_size, double scale, double eps, int32_t num_threads, float* out, char* error, int64_t error_len) {
  if (num_tokens < 1 || hidden < 1 || head_dim < 2 || states_stride < hidden) {
    std::snprintf(error, static_cast<size_t>(error_len), "bad sizes: tokens %lld hidden %lld head_dim %lld",
                  static_cast<long long>(num_tokens), static_cast<long long>(hidden),
                  static_cast<long long>(head_dim));
    return 1;
  }
  thread_local std::vector<float> kept;
  // [num_tokens, 2 * hidden] the fc's input, [num_tokens, hidden] its output, [num_tokens,
  // head_dim] each position's rotary row
  float* joined = draftgate::at_least(kept, static_cast<size_t>(num_tokens * (3 * hidden + head_dim)));
  float* projected = joined + num_tokens * 2 * hidden;
  float* cos_sin = projected + num_tokens * hidden;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t token = token_ids[t], position = positions[t];
    if (token < 0 || token >= vocab_size || position < 0 || position >= max_positions) {
      std::snprintf(error, static_cast<size_t>(error_len), "token %lld or position %lld out of range",
                    static_cast<long long>(token), static_cast<long long>(position));
      return 1;
    }
    const float* row = embedding + token * hidden;
    std::copy(row, row + hidden, joined + t * 2 * hidden);
    std::copy(states + t * states_stride, states + t * states_stride + hidden, joined + t * 2 * hidden + hidden);
    std::copy(cos_sin_table + position * head_dim, cos_sin_table + (position + 1) * head_dim, cos_sin + t * head_dim);
  }
  if (draftgate::linear(joined, fc_weight, fc_dtype, fc_scales, nullptr, projected, num_tokens, hidden, 2 * hidden,
                        num_threads, error, error_len) != 0)
    return 1;
  return draftgate_decoder_layers(layer, 1, final_norm, projected, cos_sin, slot_mapping, block_table,
                                  block_table_stride, max_blocks_per_req, query_start_loc, seq_lens, num_reqs,
                                  num_tokens, hidden, num_heads, num_kv_heads, head_dim, intermediate, num_blocks,
                                  block_size, scale, eps, num_threads, out, error, error_len);
}

// For each of num_rows states x [num_rows, hidden]: the draft vocabulary's logits x W^T (W
// [vocab_rows, hidden] held as dtype), their first maximum's row, mapped through vocab_ids
// ([vocab_rows] int64 target ids; null: the row itself) into tokens [num_rows] int64, and its
// softmax probability 1 / sum_j exp(logit_j - max) into probs [num_rows] float32.
extern "C" int draftgate_draft_top1(const float* x, int64_t num_rows, int64_t hidden, const void* weight,
                                    int64_t dtype, const float* scales, int64_t vocab_rows, const int64_t* vocab_ids,
                                    int32_t num_threads, int64_t* tokens, float* probs, char* error,
                                    int64_t error_len) {
  if (num_rows < 1 || hidden < 1 || vocab_rows < 1) {
    std::snprintf(error, static_cast<size_t>(error_len), "bad sizes: rows %lld hidden %lld vocab %lld",
                  static_cast<long long>(num_rows), static_cast<long long>(hidden),
                  static_cast<long long>(vocab_rows));
    return 1;
  }
  thread_local std::vector<float> kept;
  float* logits = draftgate::at_least(kept, static_cast<size_t>(num_rows * vocab_rows));  // [num_rows, vocab_rows]
  if (draftgate::linear(x, weight, dtype, scales, nullptr, logits, num_rows, vocab_rows, hidden, num_threads, error,
                        error_len) != 0)
    return 1;
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* row = logits + r * vocab_rows;
    int64_t best = 0;
    for (int64_t j = 1; j < vocab_rows; ++j)
      if (row[j] > row[best]) best = j;  // the first maximum, as torch.argmax
    // sum_j e^(logit_j - max), 16 lanes at a time (vec.h's e^x), the lanes folded at the end
    const draftgate::Vec top = draftgate::vset1(row[best]);
    draftgate::Vec lanes = draftgate::vzero();
    for (int64_t j = 0; j < vocab_rows; j += draftgate::kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(draftgate::kLanes, vocab_rows - j));
      // A partial tail's missing lanes load as 0 and would add e^(0 - max): masked to -inf (-> 0).
      draftgate::Vec shifted = draftgate::vsub(draftgate::vload(row + j, n), top);
      if (n < draftgate::kLanes) shifted = draftgate::vkeep_range(shifted, 0, n);
      lanes = draftgate::vadd(lanes, draftgate::vexp(shifted));
    }
    tokens[r] = vocab_ids != nullptr ? vocab_ids[best] : best;
    probs[r] = 1.0f / draftgate::vsum(lanes);
  }
  return 0;
}
