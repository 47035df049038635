#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/indexer.h"

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

// Shared: q [NI][cI] bf16, w [NI] fp32, scores [P] fp32, index [P] int32 (P = power of two >= max visible).
template <int NI>
__global__ void indexer_topk_kernel(int64_t* sel, const bf16* q, const float* w, const bf16* keys,
                                    IndexerTopkArgs a, int P) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int cI = int(a.head_dim);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  float* ws = reinterpret_cast<float*>(qs + NI * cI);
  float* sc = ws + NI;
  int* ix = reinterpret_cast<int*>(sc + P);
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < NI * cI; i += blockDim.x) qs[i] = q[t * NI * cI + i];
  for (int i = threadIdx.x; i < NI; i += blockDim.x) ws[i] = w[t * NI + i] * a.w_scale;
  __syncthreads();
  const int64_t vb = a.vis_begin[t];
  const int nv = int(a.vis_end[t] - vb);
  const float inv_sqrt_c = rsqrtf(float(cI));
  for (int s = threadIdx.x; s < P; s += blockDim.x) {
    float score = -INFINITY;
    if (s < nv) {
      float acc[NI];
#pragma unroll
      for (int h = 0; h < NI; ++h) acc[h] = 0.f;
      const bf16* key = keys + (vb + s) * cI;
      for (int k = 0; k < cI; k += 8) {
        const uint4 kr = *reinterpret_cast<const uint4*>(key + k);
        const bf16* kb = reinterpret_cast<const bf16*>(&kr);
        float kf[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) kf[u] = __bfloat162float(kb[u]);
#pragma unroll
        for (int h = 0; h < NI; ++h) {
          const uint4 qr = *reinterpret_cast<const uint4*>(qs + h * cI + k);
          const bf16* qb = reinterpret_cast<const bf16*>(&qr);
#pragma unroll
          for (int u = 0; u < 8; ++u) acc[h] += __bfloat162float(qb[u]) * kf[u];
        }
      }
      score = 0.f;
#pragma unroll
      for (int h = 0; h < NI; ++h) score += ws[h] * fmaxf(acc[h], 0.f);
      score *= inv_sqrt_c;
    }
    sc[s] = score;
    ix[s] = s;
  }
  __syncthreads();
  // Bitonic sort, descending by score, ties by ascending index (padding: -inf with the largest indices).
  for (int size = 2; size <= P; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const float si = sc[i], sj = sc[j];
          const int ii = ix[i], ij = ix[j];
          const bool i_first = si > sj || (si == sj && ii < ij);
          if (i_first != desc) {
            sc[i] = sj, sc[j] = si;
            ix[i] = ij, ix[j] = ii;
          }
        }
      }
      __syncthreads();
    }
  const int take = nv < a.k_sel ? nv : int(a.k_sel);
  for (int s = threadIdx.x; s < a.k_sel; s += blockDim.x) sel[t * a.k_sel + s] = s < take ? vb + ix[s] : -1;
}

template <int NI>
void launch(int64_t* sel, const bf16* q, const float* w, const bf16* keys, const IndexerTopkArgs& a, int P,
            size_t smem, cudaStream_t s) {
  if (smem > 48 * 1024)
    TREX_CUDA(cudaFuncSetAttribute(indexer_topk_kernel<NI>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  indexer_topk_kernel<NI><<<unsigned(a.n_tok), kThreads, smem, s>>>(sel, q, w, keys, a, P);
  TREX_CUDA_LAUNCHED();
}

}  // namespace

void indexer_topk(int64_t* sel, const bf16* q, const float* w, const bf16* keys, const IndexerTopkArgs& a,
                  cudaStream_t s) {
  if (a.n_tok == 0) return;
  TREX_CHECK(a.head_dim > 0 && a.head_dim % 8 == 0, "indexer_topk: head dim {} must be a multiple of 8",
             a.head_dim);
  TREX_CHECK(a.k_sel > 0, "indexer_topk: k_sel {} must be positive", a.k_sel);
  int P = 1;
  while (P < a.max_visible) P <<= 1;
  const size_t smem = size_t(a.n_heads * a.head_dim) * 2 + size_t(a.n_heads) * 4 + size_t(P) * 8;
  TREX_CHECK(smem <= 220 * 1024, "indexer_topk: {} visible entries need {} bytes of shared memory", a.max_visible,
             smem);
  switch (a.n_heads) {
    case 4: return launch<4>(sel, q, w, keys, a, P, smem, s);
    case 8: return launch<8>(sel, q, w, keys, a, P, smem, s);
    case 16: return launch<16>(sel, q, w, keys, a, P, smem, s);
    case 32: return launch<32>(sel, q, w, keys, a, P, smem, s);
    case 64: return launch<64>(sel, q, w, keys, a, P, smem, s);
    default: fail("indexer_topk: {} indexer heads unsupported (4, 8, 16, 32 or 64)", a.n_heads);
  }
}

}  // namespace trex::cuda
