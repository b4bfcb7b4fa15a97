// What the CPU kernels' C++ files call of each other (one extension, built by runtime/native/cpu/paged_attention.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace trtllm_gateway_cpu {

// runtime/native/cpu/paged_decode_attention.cpp: q [B, H, D] float32, already scaled -> float32 [B, H, D]
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, int64_t window, const c10::optional<at::Tensor>& sinks);

// runtime/native/cpu/quantized_linear.cpp: x [N, in] (bfloat16 or float32) times a packed int4 / tiled int8 weight ->
// [N, out] in x's dtype, written into `out`
void int4_linear_into(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                      const at::Tensor& offset, at::Tensor& out);
void int8_linear_into(const at::Tensor& x, const at::Tensor& tiled, const at::Tensor& scale, at::Tensor& out);

// runtime/native/cpu/spread.cpp: fn(begin, end) over [0, tasks), on every usable core when `work` (multiply-adds) is at
// least kSpreadWork (about 50 us of one core's products), else on the calling thread
constexpr int64_t kSpreadWork = int64_t(1) << 21;
void spread(int64_t tasks, int64_t work, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace trtllm_gateway_cpu
