// Stores a step's new keys and values into head-major KV blocks on CPUs.
//
// The contract is kernels/kv_store.py's store_kv_ref: token i's key and value for every kv head
// go to slot slot_mapping[i] (block slot / block_size, offset slot % block_size), cast to the
// cache's dtype. One call replaces the reference's handful of small tensor ops (integer
// division, modulo, dtype cast and two index_put calls) with a copy loop.
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "vec.h"

namespace draftgate {
namespace {

enum DType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

template <typename S, typename D>
void copy_row(const S* src, int64_t n, D* dst) {
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(D));
  } else {
    for (int64_t d = 0; d < n; ++d) from_float(to_float(src[d]), dst + d);
  }
}

template <typename S, typename D>
void store(const S* src, int64_t token_stride, int64_t head_stride, D* cache, const int64_t* slot_mapping,
           int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim, int64_t block_size) {
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t block = slot_mapping[i] / block_size, offset = slot_mapping[i] % block_size;
    for (int64_t h = 0; h < num_kv_heads; ++h)
      copy_row(src + i * token_stride + h * head_stride, head_dim,
               cache + ((block * num_kv_heads + h) * block_size + offset) * head_dim);
  }
}

template <typename S>
void store_any(const void* src, int64_t token_stride, int64_t head_stride, void* cache, int32_t cache_dtype,
               const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim,
               int64_t block_size) {
  const S* typed = static_cast<const S*>(src);
  if (cache_dtype == kFloat32)
    store(typed, token_stride, head_stride, static_cast<float*>(cache), slot_mapping, num_tokens, num_kv_heads,
          head_dim, block_size);
  else
    store(typed, token_stride, head_stride, static_cast<bf16_t*>(cache), slot_mapping, num_tokens, num_kv_heads,
          head_dim, block_size);
}

void store_tensor(const void* src, int32_t src_dtype, int64_t token_stride, int64_t head_stride, void* cache,
                  int32_t cache_dtype, const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                  int64_t head_dim, int64_t block_size) {
  if (src_dtype == kFloat32)
    store_any<float>(src, token_stride, head_stride, cache, cache_dtype, slot_mapping, num_tokens, num_kv_heads,
                     head_dim, block_size);
  else
    store_any<bf16_t>(src, token_stride, head_stride, cache, cache_dtype, slot_mapping, num_tokens, num_kv_heads,
                      head_dim, block_size);
}

}  // namespace
}  // namespace draftgate

using namespace draftgate;

// Returns 0, or 1 with a message in `error` (nothing written then: slots are checked first).
extern "C" int draftgate_store_kv(
    const void* key, int32_t key_dtype, int64_t key_token_stride, int64_t key_head_stride,
    const void* value, int32_t value_dtype, int64_t value_token_stride, int64_t value_head_stride,
    void* k_cache, void* v_cache, int32_t cache_dtype, const int64_t* slot_mapping, int64_t num_tokens,
    int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size, char* error,
    int64_t error_len) {
  for (int32_t code : {key_dtype, value_dtype, cache_dtype})
    if (code != kFloat32 && code != kBFloat16) {
      std::snprintf(error, static_cast<size_t>(error_len), "unsupported dtype code %d", code);
      return 1;
    }
  const int64_t num_slots = num_blocks * block_size;
  for (int64_t i = 0; i < num_tokens; ++i)
    if (slot_mapping[i] < 0 || slot_mapping[i] >= num_slots) {
      std::snprintf(error, static_cast<size_t>(error_len),
                    "slot_mapping[%lld] = %lld is outside the cache's %lld slots",
                    static_cast<long long>(i), static_cast<long long>(slot_mapping[i]),
                    static_cast<long long>(num_slots));
      return 1;
    }
  store_tensor(key, key_dtype, key_token_stride, key_head_stride, k_cache, cache_dtype, slot_mapping, num_tokens,
               num_kv_heads, head_dim, block_size);
  store_tensor(value, value_dtype, value_token_stride, value_head_stride, v_cache, cache_dtype, slot_mapping,
               num_tokens, num_kv_heads, head_dim, block_size);
  return 0;
}
