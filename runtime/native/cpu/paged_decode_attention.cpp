// Paged decode attention on CPU: each sequence's one new query token attends over its cached K/V where the
// cache holds them, block by block, with no gather into a padded copy. Built at start-up by
// runtime/native/cpu/paged_attention.py (torch.utils.cpp_extension, -O3 -march=native).
//
// Cache layout per layer (runtime/native/kv_cache.py): [2, num_blocks, block_size, kv_heads, head_dim], K then V.
// One task per (sequence, KV head): the group of query heads sharing that KV head reads each cached row once.
// A sliding window starts each row at its first visible key (the blocks before it are not read); attention sinks
// (gpt-oss) add one logit per query head to the softmax's denominator.
// Two passes: the scores and their maximum, then the softmax-weighted sum of V, all in float32. The loops
// use 16-lane vectors (GCC/Clang vector extensions: AVX-512 registers where the CPU has them, pairs of AVX2
// or four NEON registers elsewhere); with the head size and group size known at compile time the query and
// the accumulators stay in registers.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kMaxChunks = 16;  // head size up to 256
constexpr int64_t kMaxGroup = 16;   // query heads per KV head
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint16_t vbits16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t vbits32 __attribute__((vector_size(kLanes * sizeof(uint32_t))));

inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline vfloat load(const c10::BFloat16* p) {  // bf16 is the top half of a float32: widen the bits
  vbits16 half;
  std::memcpy(&half, p, sizeof half);
  const vbits32 wide = __builtin_convertvector(half, vbits32) << 16;
  vfloat v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

inline vfloat load(const c10::Half* p) {
  float f[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) f[i] = static_cast<float>(p[i]);
  return load(f);
}

inline float lane_sum(vfloat v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

inline void prefetch(const void* start, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(static_cast<const char*>(start) + at);
}

struct Shape {
  int64_t heads, kv_heads, head_dim, block_size, cache_blocks, table_width;
};

// One (sequence, KV head) task. kDim and kGroup: head size and query heads per KV head as compile-time
// constants, or 0 for any (up to kMaxChunks * kLanes and kMaxGroup).
template <int64_t kDim, int64_t kGroup, typename cache_t>
void attend(const float* q, const cache_t* cache, const int32_t* table, int64_t begin, int64_t length, int64_t h,
            const float* sinks, const Shape& s, std::vector<float>& scores, float* out) {
  const int64_t chunks = (kDim ? kDim : s.head_dim) / kLanes, group = kGroup ? kGroup : s.heads / s.kv_heads;
  const int64_t dim = chunks * kLanes, row_stride = s.kv_heads * dim;
  const int64_t half = s.cache_blocks * s.block_size * row_stride;  // where V starts
  const auto block_rows = [&](int64_t first) {  // this head's part of the rows of the block holding `first`
    return cache + int64_t(table[first / s.block_size]) * s.block_size * row_stride + h * dim;
  };
  // every cached row begin .. length-1 of this head, block by block: `visit(t, row)` with t counted from `begin`.
  // Blocks lie anywhere in the cache, so the hardware cannot guess the next one: row j of the next block is fetched
  // while row j of this one is read
  const auto for_each_row = [&](int64_t offset, auto&& visit) {
    for (int64_t first = begin; first < length; first = (first / s.block_size + 1) * s.block_size) {
      const cache_t* rows = block_rows(first) + offset + (first % s.block_size) * row_stride;
      const int64_t block_end = (first / s.block_size + 1) * s.block_size;
      const cache_t* next = block_end < length ? block_rows(block_end) + offset : nullptr;
      const int64_t count = std::min(block_end, length) - first;
      for (int64_t j = 0; j < count; ++j) {
        if (next != nullptr) prefetch(next + j * row_stride, dim * sizeof(cache_t));
        visit(first - begin + j, rows + j * row_stride);
      }
    }
  };
  const int64_t seen = length - begin;

  vfloat qv[kGroup ? kGroup : kMaxGroup][kDim ? kDim / kLanes : kMaxChunks];
  for (int64_t g = 0; g < group; ++g)
    for (int64_t c = 0; c < chunks; ++c) qv[g][c] = load(q + g * dim + c * kLanes);
  scores.resize(group * seen);
  float top[kMaxGroup], total[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) top[g] = sinks != nullptr ? sinks[g] : -INFINITY;
  for_each_row(0, [&](int64_t t, const cache_t* row) {
    vfloat k[kDim ? kDim / kLanes : kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) k[c] = load(row + c * kLanes);
    for (int64_t g = 0; g < group; ++g) {
      vfloat dot = qv[g][0] * k[0];
      for (int64_t c = 1; c < chunks; ++c) dot += qv[g][c] * k[c];
      const float score = lane_sum(dot);
      scores[g * seen + t] = score;
      top[g] = std::max(top[g], score);
    }
  });
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores.data() + g * seen;
    float sum = sinks != nullptr ? std::exp(sinks[g] - top[g]) : 0.0f;
    for (int64_t t = 0; t < seen; ++t) sum += (sg[t] = std::exp(sg[t] - top[g]));
    total[g] = sum;
  }

  vfloat acc[kGroup ? kGroup : kMaxGroup][kDim ? kDim / kLanes : kMaxChunks] = {};
  for_each_row(half, [&](int64_t t, const cache_t* row) {
    vfloat v[kDim ? kDim / kLanes : kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) v[c] = load(row + c * kLanes);
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * seen + t];
      for (int64_t c = 0; c < chunks; ++c) acc[g][c] += p * v[c];
    }
  });
  for (int64_t g = 0; g < group; ++g)
    for (int64_t c = 0; c < chunks; ++c) {
      const vfloat o = acc[g][c] / total[g];
      std::memcpy(out + g * dim + c * kLanes, &o, sizeof o);
    }
}

template <int64_t kDim, int64_t kGroup, typename cache_t>
void decode(const float* q, const cache_t* cache, const int32_t* tables, const int32_t* seq_lens, float* out,
            int64_t batch, int64_t window, const float* sinks, const Shape& s) {
  const int64_t group = s.heads / s.kv_heads;
  int64_t work = 0;  // multiply-adds: (q.k and p.v) x head size x the keys each query head reads
  for (int64_t b = 0; b < batch; ++b) work += 2 * s.heads * s.head_dim * std::min<int64_t>(seq_lens[b], window > 0 ? window : seq_lens[b]);
  trtllm_gateway_cpu::spread(batch * s.kv_heads, work, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.kv_heads, h = task % s.kv_heads;
      const int64_t at = (b * s.heads + h * group) * s.head_dim;  // the group's query heads
      const int64_t length = seq_lens[b], first = window > 0 ? std::max<int64_t>(0, length - window) : 0;
      attend<kDim, kGroup>(q + at, cache, tables + b * s.table_width, first, length, h,
                           sinks != nullptr ? sinks + h * group : nullptr, s, scores, out + at);
    }
  });
}

template <typename cache_t>
void dispatch(const float* q, const cache_t* cache, const int32_t* tables, const int32_t* seq_lens, float* out,
              int64_t batch, int64_t window, const float* sinks, const Shape& s) {
  const int64_t group = s.heads / s.kv_heads;
  // the shapes of the models we serve most (SmolLM2: 64/3, the demo: 32/4, Llama 3 and Mistral: 128/4)
  if (s.head_dim == 64 && group == 3) return decode<64, 3>(q, cache, tables, seq_lens, out, batch, window, sinks, s);
  if (s.head_dim == 32 && group == 4) return decode<32, 4>(q, cache, tables, seq_lens, out, batch, window, sinks, s);
  if (s.head_dim == 128 && group == 4) return decode<128, 4>(q, cache, tables, seq_lens, out, batch, window, sinks, s);
  decode<0, 0>(q, cache, tables, seq_lens, out, batch, window, sinks, s);
}

}  // namespace

namespace trtllm_gateway_cpu {

// q [B, H, D] float32, already scaled; kv_cache [2, N, block_size, Hkv, D]; block_tables int32 [B, >= blocks of
// the longest row]; seq_lens int32 [B] (>= 1, counting the new token, whose K/V is already in the cache); window:
// the keys a query sees (0: all); sinks: float32 [H] attention-sink logits, or none. Returns float32 [B, H, D].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, int64_t window, const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q: contiguous float32 [B, H, D]");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache: contiguous [2, blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(), "block_tables: int32");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "seq_lens: int32");
  const int64_t batch = q.size(0);
  const Shape s{q.size(1), kv_cache.size(3), q.size(2), kv_cache.size(2), kv_cache.size(1), block_tables.size(1)};
  TORCH_CHECK(kv_cache.size(4) == s.head_dim && s.heads % s.kv_heads == 0, "q and kv_cache heads do not match");
  TORCH_CHECK(s.head_dim % kLanes == 0 && s.head_dim <= kMaxChunks * kLanes && s.heads / s.kv_heads <= kMaxGroup,
              "head size: a multiple of 16 up to 256, and up to 16 query heads per KV head");
  TORCH_CHECK(block_tables.size(0) == batch && seq_lens.size(0) == batch, "one table and length per row");
  const bool has_sinks = sinks.has_value() && sinks->defined();
  TORCH_CHECK(!has_sinks || (sinks->scalar_type() == at::kFloat && sinks->is_contiguous() && sinks->numel() == s.heads),
              "sinks: contiguous float32 [H]");
  const float* sink_logits = has_sinks ? sinks->data_ptr<float>() : nullptr;
  auto out = at::empty_like(q);
  const auto run = [&](const auto* cache) {
    dispatch(q.data_ptr<float>(), cache, block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
             out.data_ptr<float>(), batch, window, sink_logits, s);
  };
  switch (kv_cache.scalar_type()) {
    case at::kFloat: run(kv_cache.data_ptr<float>()); break;
    case at::kBFloat16: run(kv_cache.data_ptr<c10::BFloat16>()); break;
    case at::kHalf: run(kv_cache.data_ptr<c10::Half>()); break;
    default: TORCH_CHECK(false, "kv_cache: float32, bfloat16 or float16, not ", kv_cache.scalar_type());
  }
  return out;
}

}  // namespace trtllm_gateway_cpu

TORCH_LIBRARY_FRAGMENT(trtllm_gateway_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, int window, "
        "Tensor? sinks) -> Tensor");
  m.impl("paged_decode_attention", c10::DispatchKey::CPU, TORCH_FN(trtllm_gateway_cpu::paged_decode_attention));
}
