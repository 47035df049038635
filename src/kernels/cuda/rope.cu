#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope.h"

namespace trex::cuda {

namespace {

__device__ inline float to_f(float v) { return v; }
__device__ inline float to_f(bf16 v) { return __bfloat162float(v); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(bf16* p, float v) { *p = __float2bfloat16(v); }

// Thread per pair; indices in I (32-bit when the pair count allows: 64-bit divisions are slow).
template <typename T, typename I>
__global__ void rope_kernel(T* x, RopeArgs a) {
  const I pairs = I(a.rope_dim / 2), heads = I(a.heads), total = I(a.rows) * heads * pairs;
  for (I i = I(blockIdx.x) * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    const I k = i % pairs, rh = i / pairs, row = rh / heads;
    const int64_t p = a.pos[row];
    const float c = a.cos[p * pairs + k], s = a.sign > 0 ? a.sin[p * pairs + k] : -a.sin[p * pairs + k];
    T* v = x + int64_t(rh) * a.c + (a.c - a.rope_dim) + 2 * int64_t(k);
    const float x0 = to_f(v[0]), x1 = to_f(v[1]);
    store(v, x0 * c - x1 * s);
    store(v + 1, x0 * s + x1 * c);
  }
}

template <typename T>
void launch(T* x, const RopeArgs& a, cudaStream_t s) {
  TREX_CHECK(a.rope_dim > 0 && a.rope_dim % 2 == 0 && a.rope_dim <= a.c, "rope (CUDA): rope_dim {} vs c {}",
             a.rope_dim, a.c);
  const int64_t total = a.rows * a.heads * (a.rope_dim / 2);
  if (total <= 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535 * 16);
  if (total + 256 * 65535 * 16 < (int64_t(1) << 32))
    rope_kernel<T, uint32_t><<<unsigned(blocks), 256, 0, s>>>(x, a);
  else
    rope_kernel<T, int64_t><<<unsigned(blocks), 256, 0, s>>>(x, a);
  TREX_CUDA_LAUNCHED();
}

// Thread per V consecutive elements of the token-major frame [N, heads * c] (V = 8: one 16-byte access; V = 1:
// any widths). Indices in I (32-bit when the tensor allows: cheaper divisions). The chunk's source and target
// follow from the token t and the offset e in its row: group g = e / X at column x = e % X.
template <int V, typename I>
__global__ void rope_permute_kernel(bf16* out, const bf16* in, RopeArgs a, I G, bool to_gm) {
  const I C = I(a.c), row = I(a.heads) * C, X = row / G, N = I(a.rows);
  const I base = C - I(a.rope_dim), pairs = I(a.rope_dim / 2), per_row = row / V;
  const I total = N * per_row;
  for (I i = I(blockIdx.x) * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    const I t = i / per_row, e = (i - t * per_row) * V;
    const I g = e / X, x = e - g * X, col = e % C;
    const int64_t tok = int64_t(t) * row + e, grp = (int64_t(g) * N + t) * X + x;
    const bf16* src = in + (to_gm ? tok : grp);
    bf16* dst = out + (to_gm ? grp : tok);
    if constexpr (V == 8) {
      uint4 u = *reinterpret_cast<const uint4*>(src);
      if (col + 8 > base) {  // C % 8 == 0 and base even: the chunk holds whole pairs
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
        const int64_t p = a.pos[t];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const I cc = col + 2 * q;
          if (cc < base) continue;
          const I k = (cc - base) / 2;
          const float cs = a.cos[p * pairs + k], sn = a.sign > 0 ? a.sin[p * pairs + k] : -a.sin[p * pairs + k];
          const float2 v = __bfloat1622float2(h[q]);
          h[q] = __halves2bfloat162(__float2bfloat16(v.x * cs - v.y * sn), __float2bfloat16(v.x * sn + v.y * cs));
        }
      }
      *reinterpret_cast<uint4*>(dst) = u;
    } else {
      if (col < base) {
        dst[0] = src[0];
        continue;
      }
      // The pair (base + 2k, base + 2k + 1) never straddles a head, hence never a group: its halves are adjacent
      // in both frames.
      const I k = (col - base) / 2;
      const bool odd = ((col - base) & 1) != 0;
      const float x0 = to_f(odd ? src[-1] : src[0]), x1 = to_f(odd ? src[0] : src[1]);
      const int64_t p = a.pos[t];
      const float cs = a.cos[p * pairs + k], sn = a.sign > 0 ? a.sin[p * pairs + k] : -a.sin[p * pairs + k];
      store(dst, odd ? x0 * sn + x1 * cs : x0 * cs - x1 * sn);
    }
  }
}

template <int V, typename I>
void launch_permute(bf16* out, const bf16* in, int64_t G, const RopeArgs& a, bool to_gm, cudaStream_t s) {
  const int64_t total = a.rows * a.heads * a.c / V;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535 * 64);
  rope_permute_kernel<V, I><<<unsigned(blocks), 256, 0, s>>>(out, in, a, I(G), to_gm);
  TREX_CUDA_LAUNCHED();
}

}  // namespace

void rope_apply(bf16* x, const RopeArgs& a, cudaStream_t s) { launch(x, a, s); }
void rope_apply(float* x, const RopeArgs& a, cudaStream_t s) { launch(x, a, s); }

void rope_permute_groups(bf16* out, const bf16* in, int64_t G, const RopeArgs& a, bool to_group_major,
                         cudaStream_t s) {
  TREX_CHECK(a.rope_dim > 0 && a.rope_dim % 2 == 0 && a.rope_dim <= a.c, "rope_permute_groups: rope_dim {} vs c {}",
             a.rope_dim, a.c);
  TREX_CHECK(G > 0 && a.heads % G == 0, "rope_permute_groups: {} heads in {} groups", a.heads, G);
  const int64_t n = a.rows * a.heads * a.c;
  if (n <= 0) return;
  const bool vec = a.c % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const bool small = n + 256 * 65535 * 64 < (int64_t(1) << 31);  // the grid-stride index stays in 32 bits
  if (vec)
    small ? launch_permute<8, uint32_t>(out, in, G, a, to_group_major, s)
          : launch_permute<8, int64_t>(out, in, G, a, to_group_major, s);
  else
    small ? launch_permute<1, uint32_t>(out, in, G, a, to_group_major, s)
          : launch_permute<1, int64_t>(out, in, G, a, to_group_major, s);
}

}  // namespace trex::cuda
