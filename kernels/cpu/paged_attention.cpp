// Paged attention over head-major KV blocks on CPUs: one call per layer covers a whole step.
//
// The contract is kernels/paged_attention.py's paged_attention_ref (the specification): request
// r owns query rows query_start_loc[r]..query_start_loc[r+1]-1, whose keys and values are
// already stored; its query t sits at position seq_len - query_len + t and sees the keys at
// positions j <= that position (and j > position - sliding_window when there is a window).
// Query head h reads kv head h / (num_heads / num_kv_heads): K and V are never repeated.
//
// How (flash-attention style, reading the cache in place):
// - The step is cut into work items: (request, kv head, a tile of query rows, a key range).
//   A tile holds about kTargetRows query vectors (rows x the query heads of one kv head), so a
//   decode row is one item per kv head and a long prefill is many tiles. Items run longest
//   first on an atomic counter (dynamic scheduling), so ragged lengths balance.
// - When there are too few items for the threads (one long decode, say), long key ranges are
//   split; each split leaves a partial (max, sum, accumulator) and a merge pass combines them.
// - An item walks its keys kKeyChunk at a time, row pointers computed from the block table:
//   scores for every query vector, an online-softmax update (running max and sum per query,
//   accumulator rescaled once per chunk), then probabilities times values. Accumulation is
//   fp32 whatever the cache holds; bf16 is widened as it is loaded.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "attention_chunk.h"
#include "vec.h"

namespace draftgate {
namespace {

constexpr int kTargetRows = 32;  // query vectors per work item
constexpr int64_t kMinSplitKeys = 128;
constexpr int kItemsPerThread = 4;  // below this many items per thread, long key ranges are split

enum DType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

struct Problem {
  const void* query;  // [num_tokens, num_heads, head_dim] with the strides below
  int32_t query_dtype;
  int64_t query_token_stride, query_head_stride;
  const void* k_cache;  // [num_blocks, num_kv_heads, block_size, head_dim] contiguous
  const void* v_cache;  // [num_blocks, num_kv_heads, block_size, head_dim] contiguous
  void* out;            // [num_tokens, num_heads, head_dim] contiguous, query dtype
  const int32_t* block_table;  // [num_reqs, >= blocks per request], rows block_table_stride apart
  int64_t block_table_stride;
  const int32_t* query_start_loc;  // [num_reqs + 1]
  const int32_t* seq_lens;         // [num_reqs]
  int64_t num_heads, num_kv_heads, group, head_dim, padded_dim, block_size;
  float scale;
  int64_t sliding_window;  // 0: none
  int64_t max_rows;        // query vectors of the largest item, padded to kRowPad
};

struct WorkItem {
  int32_t req, kv_head, q0, q1;  // query rows q0..q1-1 of the request, heads of one kv head
  int32_t k0, k1;                // keys k0..k1-1 (positions)
  int32_t partial;               // -1: writes the output; else its partial slot
  int64_t cost;
};

struct MergeGroup {
  int32_t req, kv_head, q0, q1, first_partial, num_partials;
};

struct Partials {
  float* acc;    // [num_partials, max_rows, padded_dim]
  float* stats;  // [num_partials, 2, max_rows]: running max, then sum
};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <typename T>
void write_row(const float* acc, float inv_sum, int64_t n, T* dst) {
  for (int64_t d = 0; d < n; ++d) from_float(acc[d] * inv_sum, dst + d);
}

void write_output(const Problem& p, int64_t token, int64_t head, const float* acc, float sum) {
  const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
  const int64_t offset = (token * p.num_heads + head) * p.head_dim;
  if (p.query_dtype == kFloat32)
    write_row(acc, inv_sum, p.head_dim, static_cast<float*>(p.out) + offset);
  else
    write_row(acc, inv_sum, p.head_dim, static_cast<bf16_t*>(p.out) + offset);
}

// Where the rows of `kv_head` at positions start, start + 1, ... of a request start, in elements
// of the cache: one division for the first, then a walk along the block table (a 64-bit division
// per key by the runtime block size cost 2-9% of the kernel's time on a Zen 2 EPYC).
struct RowWalk {
  const int32_t* table;
  int64_t kv_head, block_size, head_dim, num_kv_heads;
  int64_t block_index, in_block;  // of the next position

  RowWalk(const Problem& p, const int32_t* table_, int64_t kv_head_, int64_t start)
      : table(table_), kv_head(kv_head_), block_size(p.block_size), head_dim(p.head_dim),
        num_kv_heads(p.num_kv_heads), block_index(start / p.block_size), in_block(start % p.block_size) {}

  int64_t next() {  // the offset of the next position's row, then steps past it
    const int64_t offset = ((int64_t(table[block_index]) * num_kv_heads + kv_head) * block_size + in_block) * head_dim;
    if (++in_block == block_size) {
      in_block = 0;
      ++block_index;
    }
    return offset;
  }
};

template <typename T>
void load_query(const Problem& p, const T* base, const WorkItem& it, float* q) {
  const int64_t first = p.query_start_loc[it.req];
  for (int32_t t = it.q0; t < it.q1; ++t)
    for (int64_t h = 0; h < p.group; ++h) {
      const T* src = base + (first + t) * p.query_token_stride + (it.kv_head * p.group + h) * p.query_head_stride;
      float* dst = q + ((t - it.q0) * p.group + h) * p.padded_dim;
      for (int64_t d = 0; d < p.head_dim; ++d) dst[d] = to_float(src[d]) * p.scale;
      for (int64_t d = p.head_dim; d < p.padded_dim; ++d) dst[d] = 0.0f;
    }
}

template <typename CT, int kNC>
void attend(const Problem& p, const WorkItem& it, float* scratch, const Partials& partials) {
  const int64_t dim = p.padded_dim, group = p.group;
  const int num_parts = static_cast<int>(dim / kLanes);
  const int tail = static_cast<int>(p.head_dim - (num_parts - 1) * kLanes);
  const int64_t num_rows = (it.q1 - it.q0) * group;
  const int64_t query_len = p.query_start_loc[it.req + 1] - p.query_start_loc[it.req];
  const int64_t first_position = p.seq_lens[it.req] - query_len;  // of the request's query 0
  const bool single_tile = query_len <= std::max<int64_t>(1, kTargetRows / group);  // as the items were cut

  // Scratch, per query vector m < num_rows (score_transposed reads q up to max_rows, a multiple
  // of its tile height; rows past num_rows are never stored).
  float* q = scratch;                               // [max_rows, dim], pre-scaled
  float* acc = q + p.max_rows * dim;                // [max_rows, dim]
  float* probs = acc + p.max_rows * dim;            // [max_rows, kKeyChunk]: scores, then probabilities
  float* sums = probs + p.max_rows * kKeyChunk;     // [max_rows, kLanes]: running sums, lane-wise
  float* running_max = sums + p.max_rows * kLanes;  // [max_rows]
  float* chunk_max = running_max + p.max_rows;      // [max_rows]: the running max after this chunk
  float* alpha = chunk_max + p.max_rows;            // [max_rows]: this chunk's rescale
  float* key_t = alpha + p.max_rows;                // [dim, kKeyChunk]: the chunk's keys, transposed
  float* values_f32 = key_t + dim * kKeyChunk;      // [kKeyChunk, dim]: the chunk's values, widened

  if (p.query_dtype == kFloat32)
    load_query(p, static_cast<const float*>(p.query), it, q);
  else
    load_query(p, static_cast<const bf16_t*>(p.query), it, q);
  // The padding rows score_transposed reads: zero, not an earlier call's values (the scratch is
  // kept between calls).
  std::fill(q + num_rows * dim, q + std::min<int64_t>(round_up(num_rows, kRowPad), p.max_rows) * dim, 0.0f);
  std::fill(acc, acc + num_rows * dim, 0.0f);
  std::fill(running_max, running_max + num_rows, kNegInf);
  std::fill(sums, sums + num_rows * kLanes, 0.0f);

  const CT* k_cache = static_cast<const CT*>(p.k_cache);
  const CT* v_cache = static_cast<const CT*>(p.v_cache);
  const int32_t* table = p.block_table + it.req * p.block_table_stride;
  const CT* key_rows[kKeyChunk];
  const CT* value_rows[kKeyChunk];
  const CT* ahead_rows[2 * kKeyChunk];  // the next chunk's key rows, then its value rows
  const int64_t row_bytes = p.head_dim * static_cast<int64_t>(sizeof(CT));

  RowWalk rows(p, table, it.kv_head, it.k0);
  for (int32_t c0 = it.k0; c0 < it.k1; c0 += kKeyChunk) {
    const int num_keys = std::min<int32_t>(kKeyChunk, it.k1 - c0);
    for (int j = 0; j < num_keys; ++j) {
      const int64_t offset = rows.next();
      key_rows[j] = k_cache + offset;
      value_rows[j] = v_cache + offset;
    }
    // Where the request's queries are one tile (decode, verification) its keys are read once:
    // the next chunk's rows start their way from memory while this one computes (a block's rows
    // are contiguous, but blocks are scattered, which defeats the hardware prefetcher). A longer
    // query (prefill) has several tiles re-reading keys that are in cache by then.
    const int64_t prefetch_end = single_tile ? std::min<int64_t>(it.k1, c0 + 2 * kKeyChunk) : 0;
    RowWalk ahead = rows;  // (copied: `rows` is already at c0 + kKeyChunk)
    int num_ahead = 0;
    for (int64_t pos = c0 + kKeyChunk; pos < prefetch_end; ++pos, ++num_ahead) {
      const int64_t offset = ahead.next();
      ahead_rows[num_ahead] = k_cache + offset;
      ahead_rows[kKeyChunk + num_ahead] = v_cache + offset;
    }
    // One-tile queries (decode, verification) score key by key (score_rows), each key row dotted
    // with every query vector while it is in registers, and spread the next chunk's prefetches
    // over those keys; a longer query's tiles (prefill) take the transposed chunk. Verification
    // went the transposed way too until 12-05: with its keys coming from memory, a request
    // verifying 2-5 tokens at 400-1000 keys took 15-27% longer per layer than by rows with the
    // spread prefetch, 8 such requests at 300 keys 28-31% (2 threads, AVX2 EPYC, caches cycled
    // past L3); a tile of 10 rows was no slower by rows either.
    if (single_tile) {
      score_rows<CT, kNC>(key_rows, num_keys, q, num_rows, num_parts, tail, probs, ahead_rows, num_ahead, row_bytes);
    } else {
      bool scored = false;
      if constexpr (kNC > 0) {
        if (num_rows >= kRowPad) {
          score_transposed<CT, kNC>(key_rows, num_keys, q, num_rows, key_t, probs);
          scored = true;
        }
      }
      if (!scored) score_rows<CT, kNC>(key_rows, num_keys, q, num_rows, num_parts, tail, probs);
    }
    online_softmax(c0, num_keys, first_position + it.q0, p.group, p.sliding_window, num_rows, probs, running_max,
                   chunk_max, alpha, sums);
    if constexpr (std::is_same_v<CT, bf16_t>) {
      if (num_rows > kRowPad) {  // several value tiles read the chunk: widen it once
        const float* wide_rows[kKeyChunk];
        for (int j = 0; j < num_keys; ++j) {
          for (int c = 0; c < num_parts; ++c)
            vstore(values_f32 + j * dim + c * kLanes, load_part<kNC>(value_rows[j], c, num_parts, tail));
          wide_rows[j] = values_f32 + j * dim;
        }
        accumulate_values<float, kNC>(p.head_dim, wide_rows, num_keys, probs, alpha, num_rows, acc);
        continue;
      }
    }
    accumulate_values<CT, kNC>(p.head_dim, value_rows, num_keys, probs, alpha, num_rows, acc);
  }

  if (it.partial < 0) {
    const int64_t first_token = p.query_start_loc[it.req];
    for (int64_t m = 0; m < num_rows; ++m)
      write_output(p, first_token + it.q0 + m / group, it.kv_head * group + m % group, acc + m * dim,
                   vsum(vload(sums + m * kLanes)));
    return;
  }
  float* dst_acc = partials.acc + it.partial * p.max_rows * dim;
  float* dst_stats = partials.stats + it.partial * 2 * p.max_rows;
  std::copy(acc, acc + num_rows * dim, dst_acc);
  std::copy(running_max, running_max + num_rows, dst_stats);
  for (int64_t m = 0; m < num_rows; ++m) dst_stats[p.max_rows + m] = vsum(vload(sums + m * kLanes));
}

// Combines the partials of one split item: weights exp(max_s - max) on each split's sum and
// accumulator (a split whose keys a query cannot see has max -inf and weight 0).
void merge(const Problem& p, const MergeGroup& g, const Partials& partials, float* scratch) {
  const int64_t dim = p.padded_dim;
  const int64_t num_rows = (g.q1 - g.q0) * p.group;
  const int64_t first_token = p.query_start_loc[g.req];
  for (int64_t m = 0; m < num_rows; ++m) {
    float best = kNegInf;
    for (int s = 0; s < g.num_partials; ++s)
      best = std::max(best, partials.stats[(g.first_partial + s) * 2 * p.max_rows + m]);
    float sum = 0.0f;
    std::fill(scratch, scratch + dim, 0.0f);
    if (best == kNegInf) {  // unreachable for valid input: every query sees its own key
      write_output(p, first_token + g.q0 + m / p.group, g.kv_head * p.group + m % p.group, scratch, 0.0f);
      continue;
    }
    for (int s = 0; s < g.num_partials; ++s) {
      const int64_t slot = g.first_partial + s;
      const float* stats = partials.stats + slot * 2 * p.max_rows;
      const float weight = std::exp(stats[m] - best);
      if (weight == 0.0f) continue;
      sum += weight * stats[p.max_rows + m];
      const float* acc = partials.acc + (slot * p.max_rows + m) * dim;
      const Vec w = vset1(weight);
      for (int64_t d = 0; d < dim; d += kLanes) vstore(scratch + d, vfma(w, vload(acc + d), vload(scratch + d)));
    }
    write_output(p, first_token + g.q0 + m / p.group, g.kv_head * p.group + m % p.group, scratch, sum);
  }
}

using AttendFn = void (*)(const Problem&, const WorkItem&, float*, const Partials&);

template <typename CT>
AttendFn select_attend(int64_t head_dim) {
  if (head_dim == 64) return attend<CT, 4>;
  if (head_dim == 128) return attend<CT, 8>;
  return attend<CT, 0>;
}

int fail(char* error, int64_t error_len, const char* message, long long a = 0, long long b = 0) {
  std::snprintf(error, static_cast<size_t>(error_len), message, a, b);
  return 1;
}

}  // namespace
}  // namespace draftgate

using namespace draftgate;

// Returns 0, or 1 with a message in `error` (nothing written to `out` then).
extern "C" int draftgate_paged_attention(
    const void* query, int32_t query_dtype, int64_t query_token_stride, int64_t query_head_stride,
    const void* k_cache, const void* v_cache, int32_t cache_dtype, void* out,
    const int32_t* block_table, int64_t block_table_stride, int64_t max_blocks_per_req,
    const int32_t* query_start_loc, const int32_t* seq_lens, int64_t num_reqs, int64_t num_tokens,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
    double scale, int64_t sliding_window, int32_t num_threads, char* error, int64_t error_len) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0)
    return fail(error, error_len, "num_heads (%lld) must be a multiple of num_kv_heads (%lld)", num_heads,
                num_kv_heads);
  if (head_dim <= 0 || block_size <= 0) return fail(error, error_len, "head_dim and block_size must be positive");
  if (sliding_window < 0) return fail(error, error_len, "sliding_window must be positive, got %lld", sliding_window);
  if ((query_dtype != kFloat32 && query_dtype != kBFloat16) || (cache_dtype != kFloat32 && cache_dtype != kBFloat16))
    return fail(error, error_len, "unsupported dtype code (query %lld, cache %lld)", query_dtype, cache_dtype);
  if (query_start_loc[0] != 0 || query_start_loc[num_reqs] != num_tokens)
    return fail(error, error_len, "query_start_loc must run from 0 to num_tokens (%lld), ends at %lld", num_tokens,
                query_start_loc[num_reqs]);

  Problem p{};
  p.query = query;
  p.query_dtype = query_dtype;
  p.query_token_stride = query_token_stride;
  p.query_head_stride = query_head_stride;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.out = out;
  p.block_table = block_table;
  p.block_table_stride = block_table_stride;
  p.query_start_loc = query_start_loc;
  p.seq_lens = seq_lens;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.group = num_heads / num_kv_heads;
  p.head_dim = head_dim;
  p.padded_dim = round_up(head_dim, kLanes);
  p.block_size = block_size;
  p.scale = static_cast<float>(scale);
  p.sliding_window = sliding_window;

  // Work items, after checking every request's lengths and every block id it will read.
  const int64_t rows_per_item = std::max<int64_t>(1, kTargetRows / p.group);
  p.max_rows = round_up(rows_per_item * p.group, kRowPad);
  std::vector<WorkItem> items;
  int64_t total_cost = 0;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t query_len = query_start_loc[r + 1] - query_start_loc[r];
    const int64_t seq_len = seq_lens[r];
    if (query_len < 0 || query_len > seq_len)
      return fail(error, error_len, "request %lld: query length %lld is negative or exceeds its seq_len", r, query_len);
    if ((seq_len + block_size - 1) / block_size > max_blocks_per_req)
      return fail(error, error_len, "request %lld: seq_len %lld needs more blocks than the block table has", r,
                  seq_len);
    const int64_t first_position = seq_len - query_len;
    const int64_t oldest = sliding_window > 0 ? std::max<int64_t>(0, first_position - sliding_window + 1) : 0;
    for (int64_t b = oldest / block_size; b * block_size < seq_len; ++b) {
      const int32_t block = block_table[r * block_table_stride + b];
      if (block < 0 || block >= num_blocks)
        return fail(error, error_len, "block table entry %lld is not a block id (num_blocks %lld)", block, num_blocks);
    }
    for (int64_t q0 = 0; q0 < query_len; q0 += rows_per_item) {
      const int64_t q1 = std::min(query_len, q0 + rows_per_item);
      const int64_t k0 = sliding_window > 0 ? std::max<int64_t>(0, first_position + q0 - sliding_window + 1) : 0;
      const int64_t k1 = first_position + q1;
      const int64_t cost = (k1 - k0 + kKeyChunk) * (q1 - q0) * p.group;
      for (int64_t g = 0; g < num_kv_heads; ++g) {
        items.push_back({static_cast<int32_t>(r), static_cast<int32_t>(g), static_cast<int32_t>(q0),
                         static_cast<int32_t>(q1), static_cast<int32_t>(k0), static_cast<int32_t>(k1), -1, cost});
        total_cost += cost;
      }
    }
  }
  if (items.empty()) return 0;

  // Too few items for the threads: split the long key ranges (on kKeyChunk boundaries).
  const int threads = std::max(1, num_threads);
  std::vector<MergeGroup> merges;
  int32_t num_partials = 0;
  if (threads > 1 && static_cast<int64_t>(items.size()) < int64_t(kItemsPerThread) * threads) {
    const int64_t target = std::max<int64_t>(1, total_cost / (int64_t(kItemsPerThread) * threads));
    std::vector<WorkItem> split;
    for (const WorkItem& it : items) {
      const int64_t num_keys = it.k1 - it.k0;
      const int64_t pieces = std::min((it.cost + target - 1) / target, num_keys / kMinSplitKeys);
      if (pieces < 2) {
        split.push_back(it);
        continue;
      }
      merges.push_back({it.req, it.kv_head, it.q0, it.q1, num_partials, static_cast<int32_t>(pieces)});
      int32_t start = it.k0;
      for (int64_t s = 1; s <= pieces; ++s) {
        const int32_t end =
            s == pieces ? it.k1 : it.k0 + static_cast<int32_t>(round_up(num_keys * s / pieces, kKeyChunk));
        WorkItem piece = it;
        piece.k0 = start;
        piece.k1 = end;
        piece.partial = num_partials++;
        piece.cost = it.cost * (end - start) / num_keys;
        split.push_back(piece);
        start = end;
      }
    }
    items.swap(split);
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });

  // Partials and each thread's scratch are kept per thread between calls (a layer's call is
  // tens of microseconds; allocating and zeroing them every call was a measurable part of it).
  // Every value is written before it is read: the partials by their pieces, the scratch by attend.
  thread_local std::vector<float> partial_acc, partial_stats;
  const Partials partials{at_least(partial_acc, static_cast<size_t>(num_partials) * p.max_rows * p.padded_dim),
                          at_least(partial_stats, static_cast<size_t>(num_partials) * 2 * p.max_rows)};
  const AttendFn attend_fn = cache_dtype == kFloat32 ? select_attend<float>(head_dim) : select_attend<bf16_t>(head_dim);
  const size_t scratch_floats = static_cast<size_t>(p.max_rows) * (2 * p.padded_dim + kKeyChunk + kLanes + 3) +
                               static_cast<size_t>(2 * kKeyChunk * p.padded_dim);
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t num_merges = static_cast<int64_t>(merges.size());
  std::atomic<int64_t> next_item{0}, next_merge{0};
  const int team = static_cast<int>(std::min<int64_t>(threads, num_items));

#pragma omp parallel num_threads(team) if (team > 1)
  {
    thread_local std::vector<float> kept;
    float* scratch = at_least(kept, scratch_floats);
    for (int64_t i; (i = next_item.fetch_add(1, std::memory_order_relaxed)) < num_items;)
      attend_fn(p, items[i], scratch, partials);
    if (num_merges > 0) {
#pragma omp barrier
      for (int64_t i; (i = next_merge.fetch_add(1, std::memory_order_relaxed)) < num_merges;)
        merge(p, merges[i], partials, scratch);
    }
  }
  return 0;
}
