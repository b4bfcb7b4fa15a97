// A whole decode step of a Llama-shaped model with int4 projections and an int8 output head, in C++: the embedding,
// every layer (RMSNorm, the int4 q/k/v projection, RoPE, the K/V write into the paged cache, paged decode
// attention, o_proj, the residual adds, the gated MLP) and the head, for N decode-shaped rows, in one call. It hands
// out the final (normed) hidden states too, which an EAGLE head reads (runtime/native/speculative/eagle.py): they are
// the head's input, so they cost nothing to keep. runtime/native/cpu/native_decode.py says when it runs and which
// weights it takes.
//
// Why: eagerly, a step of SmolLM2 is about 60 PyTorch operators per layer, each a Python dispatch that does little
// work (at one stream most of the step); torch.compile removes them but costs a minute at every start. Here the
// elementwise work is a few loops per layer and the products are the int4/int8 kernels of quantized_linear.cpp.
// The values are those of the eager step: the same kernels for the products and attention, the same formulas
// elsewhere, and in bfloat16 the same roundings to bfloat16 wherever the eager step holds a bfloat16 tensor.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "cpu_kernels.h"

namespace {

// packed rows of the step (runtime/native/decode_rows.py)
constexpr int64_t kIds = 0, kPositions = 1, kSlots = 2, kLengths = 3;
// weights: these first, then kPerLayer per layer in this order
constexpr int64_t kEmbed = 0, kFinalNorm = 1, kHead = 2, kHeadScale = 3, kFirstLayer = 4;
enum Layer { kInNorm, kQkv, kQkvScale, kQkvOffset, kO, kOScale, kOOffset, kPostNorm, kGateUp, kGateUpScale,
             kGateUpOffset, kDown, kDownScale, kDownOffset, kPerLayer };

inline float rounded(float v, float) { return v; }
inline float rounded(float v, c10::BFloat16) { return static_cast<float>(c10::BFloat16(v)); }

// The step's per-row work goes to the helper threads (spread.cpp) when there is enough of it: an element of a row
// weighs kElementCost multiply-adds of the products (whose kSpreadWork the threshold counts): at 16 streams of
// SmolLM2 these loops took 23% of the step on one core while the products were spread (py-spy, 2026-11-28).
constexpr int64_t kElementCost = 256;

template <typename F>
void for_rows(int64_t rows, int64_t elements, F fn) {
  trtllm_gateway_cpu::spread(rows, rows * elements * kElementCost, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}

// x += residual (when given), then y = weight * (x / rms(x)), as runtime/native/models/norm.py: the normalised row is
// cast to the activations' dtype before the weight multiplies it
template <typename T>
void add_norm(T* x, const T* residual, const T* weight, T* y, int64_t rows, int64_t dim, float eps) {
  for_rows(rows, dim, [&](int64_t r) {
    T* xr = x + r * dim;
    if (residual != nullptr)
      for (int64_t i = 0; i < dim; ++i) xr[i] = T(static_cast<float>(xr[i]) + static_cast<float>(residual[r * dim + i]));
    float squares = 0;
    for (int64_t i = 0; i < dim; ++i) squares += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
    const float scale = 1.0f / std::sqrt(squares / dim + eps);
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = T(static_cast<float>(weight[i]) * rounded(static_cast<float>(xr[i]) * scale, T()));
  });
}

// rotate-half RoPE of `heads` heads of row `x` at one position, as runtime/native/models/rotary_embedding.py: cos and sin
// cast to the activations' dtype, each product rounded, then summed
template <typename T>
void rope(T* x, int64_t heads, int64_t dim, const float* cos, const float* sin) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    T* v = x + h * dim;
    for (int64_t i = 0; i < half; ++i) {
      const float c = rounded(cos[i], T()), s = rounded(sin[i], T());
      const float x1 = v[i], x2 = v[i + half];
      v[i] = T(rounded(x1 * c, T()) + rounded(x2 * -s, T()));
      v[i + half] = T(rounded(x2 * c, T()) + rounded(x1 * s, T()));
    }
  }
}

template <typename T>
std::tuple<at::Tensor, at::Tensor> step(const at::Tensor& rows, const at::Tensor& tables, at::TensorList w, at::TensorList kv_caches,
                const at::Tensor& cos_cache, const at::Tensor& sin_cache, double eps, double attn_scale, int64_t heads,
                int64_t kv_heads, int64_t head_dim) {
  const int64_t vocab = w[kEmbed].size(0), n = rows.size(1), hidden = w[kEmbed].size(1), layers = kv_caches.size();
  const int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, qkv_size = q_size + 2 * kv_size;
  const int64_t inter = w[kFirstLayer + kDown].size(1) * 4, half = head_dim / 2;  // down_proj reads the MLP's width
  const int64_t* ids = rows[kIds].data_ptr<int64_t>();
  const int64_t* positions = rows[kPositions].data_ptr<int64_t>();
  const int64_t* slots = rows[kSlots].data_ptr<int64_t>();
  const at::Tensor lengths = rows[kLengths].to(at::kInt);
  const float* cos = cos_cache.data_ptr<float>();
  const float* sin = sin_cache.data_ptr<float>();
  const auto options = w[kEmbed].options();
  at::Tensor x = at::empty({n, hidden}, options), h = at::empty({n, hidden}, options);
  at::Tensor qkv = at::empty({n, qkv_size}, options), attn = at::empty({n, q_size}, options);
  at::Tensor o = at::empty({n, hidden}, options), gate_up = at::empty({n, 2 * inter}, options);
  at::Tensor act = at::empty({n, inter}, options), q = at::empty({n, heads, head_dim}, options.dtype(at::kFloat));
  const T* embed = w[kEmbed].data_ptr<T>();
  T* xp = x.data_ptr<T>();
  for (int64_t r = 0; r < n; ++r) std::copy(embed + ids[r] * hidden, embed + (ids[r] + 1) * hidden, xp + r * hidden);
  T *hp = h.data_ptr<T>(), *qkvp = qkv.data_ptr<T>(), *attnp = attn.data_ptr<T>(), *op = o.data_ptr<T>();
  T *gup = gate_up.data_ptr<T>(), *actp = act.data_ptr<T>();
  float* qp = q.data_ptr<float>();
  const float scale = static_cast<float>(attn_scale);
  const float norm_eps = static_cast<float>(eps);
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* lw = w.data() + kFirstLayer + l * kPerLayer;
    add_norm(xp, l == 0 ? nullptr : op, lw[kInNorm].data_ptr<T>(), hp, n, hidden, norm_eps);  // the MLP's residual
    trtllm_gateway_cpu::int4_linear_into(h, lw[kQkv], lw[kQkvScale], lw[kQkvOffset], qkv);
    const at::Tensor& cache = kv_caches[l];
    T* k_cache = cache.data_ptr<T>();
    T* v_cache = k_cache + cache.numel() / 2;
    for_rows(n, qkv_size, [&](int64_t r) {
      T* row = qkvp + r * qkv_size;
      const float* c = cos + positions[r] * half;
      const float* s = sin + positions[r] * half;
      rope(row, heads, head_dim, c, s);
      rope(row + q_size, kv_heads, head_dim, c, s);
      std::copy(row + q_size, row + q_size + kv_size, k_cache + slots[r] * kv_size);
      std::copy(row + q_size + kv_size, row + qkv_size, v_cache + slots[r] * kv_size);
      for (int64_t i = 0; i < q_size; ++i) qp[r * q_size + i] = static_cast<float>(row[i]) * scale;
    });
    const at::Tensor out = trtllm_gateway_cpu::paged_decode_attention(q, cache, tables, lengths, 0, c10::nullopt);
    const float* outp = out.data_ptr<float>();
    for_rows(n, q_size, [&](int64_t r) {
      for (int64_t i = r * q_size; i < (r + 1) * q_size; ++i) attnp[i] = T(outp[i]);
    });
    trtllm_gateway_cpu::int4_linear_into(attn, lw[kO], lw[kOScale], lw[kOOffset], o);
    add_norm(xp, op, lw[kPostNorm].data_ptr<T>(), hp, n, hidden, norm_eps);  // the attention's residual
    trtllm_gateway_cpu::int4_linear_into(h, lw[kGateUp], lw[kGateUpScale], lw[kGateUpOffset], gate_up);
    for_rows(n, inter, [&](int64_t r) {
      for (int64_t i = 0; i < inter; ++i) {
        const float g = gup[r * 2 * inter + i];
        const float silu = rounded(g / (1.0f + std::exp(-g)), T());
        actp[r * inter + i] = T(silu * static_cast<float>(gup[r * 2 * inter + inter + i]));
      }
    });
    trtllm_gateway_cpu::int4_linear_into(act, lw[kDown], lw[kDownScale], lw[kDownOffset], o);
  }
  add_norm(xp, layers > 0 ? op : nullptr, w[kFinalNorm].data_ptr<T>(), hp, n, hidden, norm_eps);
  at::Tensor logits = at::empty({n, vocab}, options);
  trtllm_gateway_cpu::int8_linear_into(h, w[kHead], w[kHeadScale], logits);
  return {logits.to(at::kFloat), h};
}

// rows: int64 [>= 4, N] (ids, positions, KV slots, lengths counting the new token); tables: int32 [N, blocks];
// weights: see kEmbed.. and Layer; kv_caches: one [2, blocks, block_size, kv_heads, head_dim] per layer;
// cos/sin: float32 [positions, head_dim / 2]. Returns float32 logits [N, vocab] and the final hidden states [N, hidden]
// (the weights' dtype).
std::tuple<at::Tensor, at::Tensor> llama_decode_step(const at::Tensor& rows, const at::Tensor& tables, at::TensorList weights,
                             at::TensorList kv_caches, const at::Tensor& cos_cache, const at::Tensor& sin_cache,
                             double eps, double attn_scale, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 2 && rows.size(0) > kLengths && rows.is_contiguous(),
              "rows: contiguous int64 [>= 4, N]");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kFirstLayer + kPerLayer * static_cast<int64_t>(kv_caches.size()),
              "weights: 4 + 14 per layer");
  TORCH_CHECK(cos_cache.scalar_type() == at::kFloat && cos_cache.is_contiguous() && sin_cache.is_contiguous() &&
              cos_cache.size(1) == head_dim / 2, "cos/sin: contiguous float32 [positions, head_dim / 2]");
  switch (weights[kEmbed].scalar_type()) {
    case at::kFloat:
      return step<float>(rows, tables, weights, kv_caches, cos_cache, sin_cache, eps, attn_scale, heads, kv_heads,
                         head_dim);
    case at::kBFloat16:
      return step<c10::BFloat16>(rows, tables, weights, kv_caches, cos_cache, sin_cache, eps, attn_scale, heads,
                                 kv_heads, head_dim);
    default: TORCH_CHECK(false, "weights: float32 or bfloat16, not ", weights[kEmbed].scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(trtllm_gateway_cpu, m) {
  m.def("llama_decode_step(Tensor rows, Tensor tables, Tensor[] weights, Tensor[] kv_caches, Tensor cos_cache, "
        "Tensor sin_cache, float eps, float attn_scale, int heads, int kv_heads, int head_dim) -> (Tensor, Tensor)");
  m.impl("llama_decode_step", c10::DispatchKey::CPU, TORCH_FN(llama_decode_step));
}
