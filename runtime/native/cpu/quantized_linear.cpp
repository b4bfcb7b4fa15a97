// Weight-only int4 and int8 products on CPU that read the packed weights as they are stored: no dequantized copy,
// one pass over the weight for all rows of x. Built with the other CPU kernels (runtime/native/cpu/paged_attention.py);
// the layouts are made by runtime/native/models/cpu_weights.py.
//
// int4, groups of 32 inputs, weight[o][i] = (q - 8) * scale[g][o] + offset[g][o], q in 0..15:
//   packed uint8 [tiles, in / 4, 32]: tiles of 16 output rows (the last padded with zeros); for each quad of inputs 4k..4k+3, byte 2r+e holds
//   row r's q of input 4k+e in its low nibble and of input 4k+2+e in its high one. scale and offset
//   [tiles, in / 32, 16] in the activations' dtype.
// int8, weight[o][i] = q * scale[o]: tiled int8 [tiles, in, 16] (16 output rows of one input side by side), scale
//   [tiles * 16].
//
// Why this layout: one 32-byte load gives 64 weights of 16 output rows, which AVX-512 BF16's dot product
// (vdpbf16ps: 16 lanes, each the sum of two bf16 products) multiplies by two broadcast input pairs with two
// instructions; a nibble becomes the bf16 number 128 + q by OR-ing in 0x4300, exactly. Per group:
//   sum_i w x = scale * sum_i (128 + q) x + (offset - 136 scale) * sum_i x
// with fp32 accumulation. float32 activations (and CPUs without AVX-512 BF16) take a float32 loop on the same
// bytes: scale * sum_i q x + (offset - 8 scale) * sum_i x. Either way every x row reuses the weights it loaded,
// up to kRowBlock rows at a time, so a step of many rows still reads each weight once from memory.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define TRTLLM_GATEWAY_BF16_DOT 1
#endif

#include "cpu_kernels.h"

namespace {

constexpr int64_t kTile = 16;     // output rows per tile: one 16-lane vector
constexpr int64_t kGroup = 32;    // int4 inputs sharing a scale and an offset
constexpr int64_t kRowBlock = 8;  // rows of x per pass over a tile (their accumulators stay in registers)

typedef float vfloat __attribute__((vector_size(kTile * sizeof(float))));
typedef int32_t vint __attribute__((vector_size(kTile * sizeof(int32_t))));
typedef uint32_t vbits __attribute__((vector_size(kTile * sizeof(uint32_t))));
typedef uint8_t vbytes16 __attribute__((vector_size(16)));
typedef int8_t vsbytes16 __attribute__((vector_size(16)));
typedef uint8_t vbytes32 __attribute__((vector_size(32)));
typedef uint16_t vwords32 __attribute__((vector_size(64)));

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

inline vfloat load16(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline vfloat load16(const c10::BFloat16* p) {  // bf16 is the top half of a float32
  typedef uint16_t vhalf __attribute__((vector_size(kTile * sizeof(uint16_t))));
  vhalf h;
  std::memcpy(&h, p, sizeof h);
  const vbits wide = __builtin_convertvector(h, vbits) << 16;
  vfloat v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

inline void store16(float* p, vfloat v, int64_t n) { std::memcpy(p, &v, n * sizeof(float)); }

inline void store16(c10::BFloat16* p, vfloat v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = c10::BFloat16(v[i]);  // round to nearest even, as torch casts
}

// x's group sums (the offsets multiply them): [rows, in / kGroup] float32
template <typename scalar_t>
std::vector<float> group_sums(const scalar_t* x, int64_t rows, int64_t in) {
  const int64_t groups = in / kGroup;
  std::vector<float> sums(rows * groups);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      vfloat a = load16(x + r * in + g * kGroup), b = load16(x + r * in + g * kGroup + kTile);
      a += b;
      float s = 0;
      for (int64_t l = 0; l < kTile; ++l) s += a[l];
      sums[r * groups + g] = s;
    }
  return sums;
}

// One tile of 16 output rows for rows [0, R) of x (R <= kRowBlock): the float32 loop.
template <int R, typename scalar_t>
void int4_tile_float(const uint8_t* tile, const scalar_t* scale, const scalar_t* offset, const scalar_t* x,
                     int64_t in, const float* sums, vfloat* acc) {
  const int64_t groups = in / kGroup;
  for (int r = 0; r < R; ++r) acc[r] = vfloat{};
  for (int64_t g = 0; g < groups; ++g) {
    vfloat dot[R] = {};
    for (int64_t k = g * kGroup / 4; k < (g + 1) * kGroup / 4; ++k) {
      vbytes32 bytes;
      std::memcpy(&bytes, tile + k * 32, 32);
      vbits pairs;  // lane r: byte 2r in bits 0-7, byte 2r+1 in bits 16-23
      const vwords32 words = __builtin_convertvector(bytes, vwords32);
      std::memcpy(&pairs, &words, sizeof pairs);
      const vfloat w0 = __builtin_convertvector((vint)(pairs & 0xF), vfloat);
      const vfloat w1 = __builtin_convertvector((vint)((pairs >> 16) & 0xF), vfloat);
      const vfloat w2 = __builtin_convertvector((vint)((pairs >> 4) & 0xF), vfloat);
      const vfloat w3 = __builtin_convertvector((vint)((pairs >> 20) & 0xF), vfloat);
      for (int r = 0; r < R; ++r) {
        const scalar_t* xr = x + r * in + 4 * k;
        dot[r] += w0 * to_float(xr[0]) + w1 * to_float(xr[1]) + w2 * to_float(xr[2]) + w3 * to_float(xr[3]);
      }
    }
    const vfloat s = load16(scale + g * kTile), m = load16(offset + g * kTile) - 8.0f * s;
    for (int r = 0; r < R; ++r) acc[r] += s * dot[r] + m * sums[r * groups + g];
  }
}

#ifdef TRTLLM_GATEWAY_BF16_DOT
// bf16 rows with AVX-512 BF16 dot products (see the file's comment), for TB tiles side by side and rows [0, R):
// TB * R independent accumulators, so that one row's dot products do not wait for each other.
template <int TB, int R>
void int4_tiles_bf16(const uint8_t* tiles, int64_t tile_stride, const c10::BFloat16* scale,
                     const c10::BFloat16* offset, int64_t param_stride, const c10::BFloat16* x, int64_t in,
                     const float* sums, vfloat* acc) {
  const int64_t groups = in / kGroup;
  const __m512i low = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
  const uint32_t* x32 = reinterpret_cast<const uint32_t*>(x);  // bf16 pairs
  __m512 total[TB][R];
  for (int b = 0; b < TB; ++b)
    for (int r = 0; r < R; ++r) total[b][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 dot[TB][R];
    for (int b = 0; b < TB; ++b)
      for (int r = 0; r < R; ++r) dot[b][r] = _mm512_setzero_ps();
    for (int64_t k = g * kGroup / 4; k < (g + 1) * kGroup / 4; ++k) {
      __m512i w01[TB], w23[TB];
      for (int b = 0; b < TB; ++b) {
        const __m512i words = _mm512_cvtepu8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tiles + b * tile_stride + k * 32)));
        w01[b] = _mm512_ternarylogic_epi32(words, low, bias, 0xEA);  // (words & low) | bias
        w23[b] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(words, 4), low, bias, 0xEA);
      }
      for (int r = 0; r < R; ++r) {
        const uint32_t* xr = x32 + (r * in + 4 * k) / 2;
        const __m512bh x01 = (__m512bh)_mm512_set1_epi32(static_cast<int>(xr[0]));
        const __m512bh x23 = (__m512bh)_mm512_set1_epi32(static_cast<int>(xr[1]));
        for (int b = 0; b < TB; ++b) {
          dot[b][r] = _mm512_dpbf16_ps(dot[b][r], (__m512bh)w01[b], x01);
          dot[b][r] = _mm512_dpbf16_ps(dot[b][r], (__m512bh)w23[b], x23);
        }
      }
    }
    for (int b = 0; b < TB; ++b) {
      const vfloat s = load16(scale + b * param_stride + g * kTile);
      const vfloat m = load16(offset + b * param_stride + g * kTile) - 136.0f * s;
      __m512 sv, mv;
      std::memcpy(&sv, &s, sizeof sv);
      std::memcpy(&mv, &m, sizeof mv);
      for (int r = 0; r < R; ++r)
        total[b][r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sums[r * groups + g]),
                                      _mm512_fmadd_ps(sv, dot[b][r], total[b][r]));
    }
  }
  for (int b = 0; b < TB; ++b)
    for (int r = 0; r < R; ++r) std::memcpy(&acc[b * kRowBlock + r], &total[b][r], sizeof(vfloat));
}
#endif

// TB tiles (tile_stride bytes apart) for rows [0, R) of x into acc[b * kRowBlock + r].
template <int TB, int R, typename scalar_t>
void int4_tiles(const uint8_t* tiles, int64_t tile_stride, const scalar_t* scale, const scalar_t* offset,
                int64_t param_stride, const scalar_t* x, int64_t in, const float* sums, vfloat* acc) {
#ifdef TRTLLM_GATEWAY_BF16_DOT
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>)
    return int4_tiles_bf16<TB, R>(tiles, tile_stride, scale, offset, param_stride, x, in, sums, acc);
#endif
  for (int b = 0; b < TB; ++b)
    int4_tile_float<R>(tiles + b * tile_stride, scale + b * param_stride, offset + b * param_stride, x, in, sums,
                       acc + b * kRowBlock);
}

template <int N>
using constant = std::integral_constant<int, N>;

// How many tiles a block takes side by side. Rows of x are taken up to kRowBlock at once and a block holds kRowBlock
// accumulators at most: int4, few rows take several tiles (independent accumulators) and many rows one tile; int8,
// whose widening of each weight is its cost, one tile from two rows on. Every block takes all its rows (up to
// kRowBlock) in one pass over the weights, so a step of K + 1 rows (a verification's) reads each weight once.
// (Before, with 4 tiles a block for 2-3 rows and 2 for 4-7, rows 3 and 5-7 took a second pass one row at a time.)
// 2-core box, 2026-11-30, bf16 x, medians of 5 interleaved rounds, ms at 3 rows: int4 3072 x 576 0.123 -> 0.073
// (4 rows 0.086), int8 49152 x 576 4.25 -> 2.33 (1 row 1.90).
inline int64_t tiles_per_block(int64_t rows, bool int8) {
  if (int8) return rows >= 2 ? 1 : 8;
  return rows >= 5 ? 1 : rows >= 3 ? 2 : rows == 2 ? 4 : 8;
}

// tile_fn(constant<TB>, constant<R>, first tile, rows offset) for TB in {1, 2, 4, 8} and R rows, TB * R <= kRowBlock
template <int TB, typename Fn>
void call_rows(int64_t r, int64_t t, int64_t r0, Fn& tile_fn) {
  switch (r) {
    case 1: return tile_fn(constant<TB>{}, constant<1>{}, t, r0);
    case 2: if constexpr (TB <= 4) return tile_fn(constant<TB>{}, constant<2>{}, t, r0); break;
    case 3: if constexpr (TB <= 2) return tile_fn(constant<TB>{}, constant<3>{}, t, r0); break;
    case 4: if constexpr (TB <= 2) return tile_fn(constant<TB>{}, constant<4>{}, t, r0); break;
    case 5: if constexpr (TB == 1) return tile_fn(constant<TB>{}, constant<5>{}, t, r0); break;
    case 6: if constexpr (TB == 1) return tile_fn(constant<TB>{}, constant<6>{}, t, r0); break;
    case 7: if constexpr (TB == 1) return tile_fn(constant<TB>{}, constant<7>{}, t, r0); break;
    case 8: if constexpr (TB == 1) return tile_fn(constant<TB>{}, constant<8>{}, t, r0); break;
  }
  TORCH_CHECK(false, "no block of ", TB, " tiles x ", r, " rows");
}

template <typename Fn>
void call_block(int64_t tb, int64_t r, int64_t t, int64_t r0, Fn& tile_fn) {
  if (tb == 8) return call_rows<8>(r, t, r0, tile_fn);
  if (tb == 4) return call_rows<4>(r, t, r0, tile_fn);
  if (tb == 2) return call_rows<2>(r, t, r0, tile_fn);
  return call_rows<1>(r, t, r0, tile_fn);
}

// Calls tile_fn over the (tile block, row block) pairs of blocks [begin, end) of per_block tiles: each block's tiles
// for all rows (up to kRowBlock at a time), a block past the last tile one tile at a time.
template <typename Fn>
void for_blocks(int64_t begin, int64_t end, int64_t tiles, int64_t rows, int64_t per_block, Fn&& tile_fn) {
  const int64_t row_step = std::min(rows, kRowBlock);
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t t = blk * per_block, tb = std::min(per_block, tiles - t);
    for (int64_t r0 = 0; r0 < rows; r0 += row_step) {
      const int64_t r = std::min(row_step, rows - r0);
      if (tb == per_block) call_block(tb, r, t, r0, tile_fn);
      else
        for (int64_t b = 0; b < tb; ++b) call_block(1, r, t + b, r0, tile_fn);
    }
  }
}

// y [rows, out] = x [rows, in] times the weight of `tiles` tiles, whose rows past `out` are padding
template <typename scalar_t>
void int4_rows(const scalar_t* x, int64_t rows, int64_t in, int64_t tiles, int64_t out, const uint8_t* packed,
               const scalar_t* scale, const scalar_t* offset, scalar_t* y) {
  const std::vector<float> sums = group_sums(x, rows, in);
  const int64_t groups = in / kGroup, tile_stride = (in / 2) * kTile, param_stride = groups * kTile;
  const int64_t per_block = tiles_per_block(rows, false);
  trtllm_gateway_cpu::spread((tiles + per_block - 1) / per_block, rows * in * out, [&](int64_t begin, int64_t end) {
    vfloat acc[8 * kRowBlock];
    for_blocks(begin, end, tiles, rows, per_block, [&](auto tb, auto r, int64_t t, int64_t r0) {
      constexpr int TB = decltype(tb)::value, R = decltype(r)::value;
      int4_tiles<TB, R>(packed + t * tile_stride, tile_stride, scale + t * param_stride, offset + t * param_stride,
                        param_stride, x + r0 * in, in, sums.data() + r0 * groups, acc);
      for (int b = 0; b < TB; ++b)
        for (int j = 0; j < R; ++j)
          store16(y + (r0 + j) * out + (t + b) * kTile, acc[b * kRowBlock + j], std::min(kTile, out - (t + b) * kTile));
    });
  });
}

// int8: TB tiles of 16 output rows for rows [0, R) of float32 x, into acc[b * kRowBlock + r] (before the scale).
template <int TB, int R>
void int8_tiles(const int8_t* tiles, int64_t tile_stride, const float* x, int64_t in, vfloat* acc) {
  vfloat total[TB][R] = {};
  for (int64_t i = 0; i < in; ++i) {
    vfloat w[TB];
    for (int b = 0; b < TB; ++b) {
#ifdef __AVX512F__
      const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tiles + b * tile_stride + i * kTile))));
      std::memcpy(&w[b], &v, sizeof v);
#else
      vsbytes16 q;
      std::memcpy(&q, tiles + b * tile_stride + i * kTile, kTile);
      w[b] = __builtin_convertvector(__builtin_convertvector(q, vint), vfloat);
#endif
    }
    for (int r = 0; r < R; ++r) {
      const float xi = x[r * in + i];
      for (int b = 0; b < TB; ++b) total[b][r] += w[b] * xi;
    }
  }
  for (int b = 0; b < TB; ++b)
    for (int r = 0; r < R; ++r) acc[b * kRowBlock + r] = total[b][r];
}

template <typename scalar_t>
void int8_rows(const scalar_t* x, int64_t rows, int64_t in, int64_t tiles, int64_t out, const int8_t* tiled,
               const scalar_t* scale, scalar_t* y) {
  std::vector<float> xf(rows * in);
  for (int64_t j = 0; j < rows * in; ++j) xf[j] = to_float(x[j]);
  const int64_t tile_stride = in * kTile, per_block = tiles_per_block(rows, true);
  trtllm_gateway_cpu::spread((tiles + per_block - 1) / per_block, rows * in * out, [&](int64_t begin, int64_t end) {
    vfloat acc[8 * kRowBlock];
    for_blocks(begin, end, tiles, rows, per_block, [&](auto tb, auto r, int64_t t, int64_t r0) {
      constexpr int TB = decltype(tb)::value, R = decltype(r)::value;
      int8_tiles<TB, R>(tiled + t * tile_stride, tile_stride, xf.data() + r0 * in, in, acc);
      for (int b = 0; b < TB; ++b) {
        const vfloat s = load16(scale + (t + b) * kTile);
        for (int j = 0; j < R; ++j)
          store16(y + (r0 + j) * out + (t + b) * kTile, acc[b * kRowBlock + j] * s, std::min(kTile, out - (t + b) * kTile));
      }
    });
  });
}

void check_x(const at::Tensor& x, const at::Tensor& params, int64_t in) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) == in, "x: contiguous [N, ", in, "]");
  TORCH_CHECK(x.scalar_type() == params.scalar_type(), "x and the scales: one dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x: float32 or bfloat16");
}

}  // namespace

namespace trtllm_gateway_cpu {

void int4_linear_into(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                      at::Tensor& out) {
  const int64_t tiles = packed.size(0), in = packed.size(1) * 4, rows = x.size(0), features = out.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.size(2) == 32 && packed.is_contiguous(),
              "packed: uint8 [out / 16, in / 4, 32]");
  TORCH_CHECK(in % kGroup == 0 && scale.sizes() == offset.sizes() && scale.is_contiguous() && offset.is_contiguous() &&
              scale.size(0) == tiles && scale.size(1) == in / kGroup && scale.size(2) == kTile,
              "scale, offset: [out / 16, in / 32, 16]");
  check_x(x, scale, in);
  TORCH_CHECK(out.is_contiguous() && out.size(0) == rows && features > (tiles - 1) * kTile && features <= tiles * kTile &&
              out.scalar_type() == x.scalar_type(), "out: contiguous [N, out] in x's dtype");
  if (x.scalar_type() == at::kFloat)
    int4_rows(x.data_ptr<float>(), rows, in, tiles, features, packed.data_ptr<uint8_t>(), scale.data_ptr<float>(),
              offset.data_ptr<float>(), out.data_ptr<float>());
  else
    int4_rows(x.data_ptr<c10::BFloat16>(), rows, in, tiles, features, packed.data_ptr<uint8_t>(),
              scale.data_ptr<c10::BFloat16>(), offset.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>());
}

void int8_linear_into(const at::Tensor& x, const at::Tensor& tiled, const at::Tensor& scale, at::Tensor& out) {
  const int64_t tiles = tiled.size(0), in = tiled.size(1), rows = x.size(0), features = out.size(1);
  TORCH_CHECK(tiled.scalar_type() == at::kChar && tiled.dim() == 3 && tiled.size(2) == kTile && tiled.is_contiguous(),
              "tiled: int8 [out / 16, in, 16]");
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == tiles * kTile && scale.is_contiguous(), "scale: [tiles * 16]");
  check_x(x, scale, in);
  TORCH_CHECK(out.is_contiguous() && out.size(0) == rows && features > (tiles - 1) * kTile && features <= tiles * kTile &&
              out.scalar_type() == x.scalar_type(), "out: contiguous [N, out] in x's dtype");
  if (x.scalar_type() == at::kFloat)
    int8_rows(x.data_ptr<float>(), rows, in, tiles, features, tiled.data_ptr<int8_t>(), scale.data_ptr<float>(),
              out.data_ptr<float>());
  else
    int8_rows(x.data_ptr<c10::BFloat16>(), rows, in, tiles, features, tiled.data_ptr<int8_t>(),
              scale.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>());
}

// out_features: the weight's rows (its last tile is padded to 16)
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                       int64_t out_features) {
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
  int4_linear_into(x, packed, scale, offset, out);
  return out;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& tiled, const at::Tensor& scale, int64_t out_features) {
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
  int8_linear_into(x, tiled, scale, out);
  return out;
}

}  // namespace trtllm_gateway_cpu

TORCH_LIBRARY_FRAGMENT(trtllm_gateway_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor scale, Tensor offset, int out_features) -> Tensor");
  m.impl("int4_linear", c10::DispatchKey::CPU, TORCH_FN(trtllm_gateway_cpu::int4_linear));
  m.def("int8_linear(Tensor x, Tensor tiled, Tensor scale, int out_features) -> Tensor");
  m.impl("int8_linear", c10::DispatchKey::CPU, TORCH_FN(trtllm_gateway_cpu::int8_linear));
}
