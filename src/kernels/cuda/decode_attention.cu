#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

// Row of position p of one item: this step's projections when p is new, else the slot's ring.
__device__ inline const bf16* row_of(const bf16* step, const bf16* ring, int64_t width, int64_t rows, int64_t slot,
                                     int64_t first_new, int64_t begin, int64_t p) {
  if (p >= first_new) return step + (begin + p - first_new) * width;
  return ring + (slot * rows + p % rows) * width;
}

// One block per entry: pooled[ch] = softmax over candidates (gate + ape) of kv, then weighted RMSNorm and RoPE at
// the window's first position. Candidate order as the CPU decoder: own rows first, then the previous window's.
__global__ void compress_entries_kernel(DecodeStep st, DecodeCompress a) {
  extern __shared__ float pooled[];  // [c]
  __shared__ float red[kThreads / 32];
  const int64_t k = blockIdx.x;
  const int64_t it = a.entry_item[k], e = a.entry_idx[k];
  const int64_t slot = st.item_slot[it], first_new = st.item_first[it], begin = st.item_begin[it];
  const int64_t m = a.ratio, c = a.c, width = (a.overlap ? 2 : 1) * c, own = a.overlap ? c : 0;
  const bool prev = a.overlap && e > 0;
  float ss = 0.f;
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t p = e * m + j;
      const bf16* g = row_of(a.step_gate, a.ring_gate, width, a.rows, slot, first_new, begin, p);
      mx = fmaxf(mx, __bfloat162float(g[own + ch]) + a.ape[j * width + own + ch]);
      if (prev) {
        const bf16* gp = row_of(a.step_gate, a.ring_gate, width, a.rows, slot, first_new, begin, p - m);
        mx = fmaxf(mx, __bfloat162float(gp[ch]) + a.ape[j * width + ch]);
      }
    }
    float sum = 0.f, acc = 0.f;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t p = e * m + j;
      const bf16* g = row_of(a.step_gate, a.ring_gate, width, a.rows, slot, first_new, begin, p);
      const bf16* v = row_of(a.step_kv, a.ring_kv, width, a.rows, slot, first_new, begin, p);
      float w = __expf(__bfloat162float(g[own + ch]) + a.ape[j * width + own + ch] - mx);
      sum += w, acc += w * __bfloat162float(v[own + ch]);
      if (prev) {
        const bf16* gp = row_of(a.step_gate, a.ring_gate, width, a.rows, slot, first_new, begin, p - m);
        const bf16* vp = row_of(a.step_kv, a.ring_kv, width, a.rows, slot, first_new, begin, p - m);
        w = __expf(__bfloat162float(gp[ch]) + a.ape[j * width + ch] - mx);
        sum += w, acc += w * __bfloat162float(vp[ch]);
      }
    }
    const float y = acc / sum;
    pooled[ch] = y;
    ss += y * y;
  }
  ss = reduce::warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) tot += red[w];
  const float rstd = rsqrtf(tot / float(c) + a.eps);
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) pooled[ch] = __bfloat162float(a.norm[ch]) * pooled[ch] * rstd;
  __syncthreads();
  bf16* out = a.entries + (slot * a.cap + e) * c;
  const int64_t np = a.rope_dim / 2, r0 = c - a.rope_dim, pos = e * m;
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float y = pooled[ch];
    if (ch >= r0) {
      const int64_t kp = (ch - r0) >> 1;
      const float cs = a.cos[pos * np + kp], sn = a.sin[pos * np + kp];
      const float x0 = pooled[r0 + 2 * kp], x1 = pooled[r0 + 2 * kp + 1];
      y = ((ch - r0) & 1) ? x0 * sn + x1 * cs : x0 * cs - x1 * sn;
    }
    out[ch] = __float2bfloat16(y);
  }
}

// One block per new token.
__global__ void store_rows_kernel(DecodeStep st, bf16* ring, const bf16* src, int64_t rows, int64_t width) {
  const int64_t i = blockIdx.x;
  const int64_t it = st.tok_item[i], pos = st.tok_pos[i];
  const int64_t final_len = st.item_first[it] + (st.item_begin[it + 1] - st.item_begin[it]);
  if (pos < final_len - rows) return;
  const int64_t slot = st.item_slot[it];
  const uint4* s = reinterpret_cast<const uint4*>(src + i * width);
  uint4* d = reinterpret_cast<uint4*>(ring + (slot * rows + pos % rows) * width);
  for (int64_t k = threadIdx.x; k < width / 8; k += blockDim.x) d[k] = s[k];
}

__global__ void visible_ranges_kernel(DecodeStep st, int64_t ratio, int64_t cap, int64_t* vb, int64_t* ve) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= st.n_tok) return;
  const int64_t slot = st.item_slot[st.tok_item[i]];
  vb[i] = slot * cap;
  ve[i] = slot * cap + (int64_t(st.tok_pos[i]) + 1) / ratio;
}

// grid (N, ceil(H / 8)), 8 warps: one warp per (token, head); lane l holds channels [l*8 + 256*j, +8), j < NC.
// Keys in the CPU's order (window oldest first, then compressed entries), visited kB at a time so the loads and the
// warp reductions of kB keys overlap (kB = 1: one key at a time, the reference order of the rounding). Online
// softmax starting from the sink (max = sink, sum = 1, acc = 0); a missing key (empty selection) weighs exp(-inf) = 0.
template <int NC, int kB>
__global__ void attention_kernel(DecodeStep st, DecodeAttention a) {
  const int64_t i = blockIdx.x;
  const int64_t h = int64_t(blockIdx.y) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (h >= a.heads) return;
  const int64_t c = a.c, it = st.tok_item[i], pos = st.tok_pos[i];
  const int64_t slot = st.item_slot[it], first_new = st.item_first[it], begin = st.item_begin[it];
  float q[NC * 8], acc[NC * 8];
  const bf16* qh = a.q + (i * a.heads + h) * c;
#pragma unroll
  for (int j = 0; j < NC; ++j) {
    const uint4 raw = *reinterpret_cast<const uint4*>(qh + j * 256 + lane * 8);
    const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int t = 0; t < 8; ++t) q[j * 8 + t] = __bfloat162float(v[t]) * a.scale, acc[j * 8 + t] = 0.f;
  }
  const int64_t t0 = pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
  const int64_t n_win = pos - t0 + 1;
  const int64_t n_cmp = a.cmp ? (a.sel ? a.k_sel : (pos + 1) / a.ratio) : 0;
  const int64_t n_keys = n_win + n_cmp;
  auto key_at = [&](int64_t k) -> const bf16* {  // null: no key (past the end, or an empty selection slot)
    if (k >= n_keys) return nullptr;
    if (k < n_win) {
      const int64_t t = t0 + k;
      return t >= first_new ? a.kv + (begin + t - first_new) * c : a.win + (slot * a.window + t % a.window) * c;
    }
    const int64_t e = k - n_win;
    if (a.sel) {
      const int64_t g = a.sel[i * a.k_sel + e];
      return g >= 0 ? a.cmp + g * c : nullptr;
    }
    return a.cmp + (slot * a.cap + e) * c;
  };
  float mx = a.sink[h], sum = 1.f;
  for (int64_t k0 = 0; k0 < n_keys; k0 += kB) {
    float kf[kB][NC * 8];
    float dot[kB];
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const bf16* key = key_at(k0 + b);
      dot[b] = 0.f;
#pragma unroll
      for (int j = 0; j < NC; ++j) {
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (key) raw = *reinterpret_cast<const uint4*>(key + j * 256 + lane * 8);
        const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          kf[b][j * 8 + t] = __bfloat162float(v[t]);
          dot[b] += q[j * 8 + t] * kf[b][j * 8 + t];
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kB; ++b) dot[b] = reduce::warp_sum(dot[b]);
    float nm = mx;
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      if (!key_at(k0 + b)) dot[b] = -INFINITY;
      nm = fmaxf(nm, dot[b]);
    }
    const float corr = __expf(mx - nm);
    float p[kB];
    sum *= corr;
#pragma unroll
    for (int b = 0; b < kB; ++b) p[b] = __expf(dot[b] - nm), sum += p[b];
#pragma unroll
    for (int t = 0; t < NC * 8; ++t) {
      float v = acc[t] * corr;
#pragma unroll
      for (int b = 0; b < kB; ++b) v += p[b] * kf[b][t];
      acc[t] = v;
    }
    mx = nm;
  }
  const float inv = 1.f / sum;
  bf16* oh = a.o + (i * a.heads + h) * c;
#pragma unroll
  for (int j = 0; j < NC; ++j) {
    uint4 raw;
    bf16* v = reinterpret_cast<bf16*>(&raw);
#pragma unroll
    for (int t = 0; t < 8; ++t) v[t] = __float2bfloat16(acc[j * 8 + t] * inv);
    *reinterpret_cast<uint4*>(oh + j * 256 + lane * 8) = raw;
  }
}

// One block per token.
__global__ void key_sets_kernel(DecodeStep st, DecodeKeySets a) {
  const int64_t i = blockIdx.x;
  const int64_t it = st.tok_item[i], p = st.tok_pos[i];
  const int64_t slot = st.item_slot[it], f = st.item_first[it];
  const int64_t w0 = p - a.window + 1;  // first position of the token's window (may be < 0)
  if (threadIdx.x == 0) a.win_begin[i] = i - (p - (w0 > f ? w0 : f));
  const int64_t n = a.n_hist + a.n_cmp;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    int64_t v = -1;
    if (j < a.n_hist) {
      const int64_t t = f - a.n_hist + j;
      if (t >= 0 && t >= w0) v = a.ring_base + slot * a.window + t % a.window;
    } else {
      const int64_t e = j - a.n_hist;
      if (a.sel)
        v = a.sel[i * a.k_sel + e];
      else if (e < (p + 1) / a.ratio)
        v = slot * a.cap + e;
    }
    a.cols[i * n + j] = v;
  }
}

__global__ void last_rows_kernel(DecodeStep st, const bf16* x, int64_t width, bf16* out) {
  const int64_t it = blockIdx.x;
  const int64_t row = st.item_begin[it + 1] - 1;
  const uint4* s = reinterpret_cast<const uint4*>(x + row * width);
  uint4* d = reinterpret_cast<uint4*>(out + it * width);
  for (int64_t k = threadIdx.x; k < width / 8; k += blockDim.x) d[k] = s[k];
}

// One block of 1024 threads per row; thread t scans indices t, t + 1024, ... (increasing, so a strict > keeps the
// first maximum), then the block reduces (value, index) pairs preferring the lower index on equal values.
__global__ void argmax_rows_kernel(const float* logits, int64_t V, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const float* row = logits + int64_t(blockIdx.x) * V;
  float bv = -INFINITY;
  int32_t bi = int32_t(V);  // "none yet": loses every tie
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = row[i];
    if (v > bv || bi == int32_t(V)) bv = v, bi = int32_t(i);
  }
  auto better = [](float v, int32_t i, float bv, int32_t bi) { return v > bv || (v == bv && i < bi); };
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w)
      if (better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    out[blockIdx.x] = bi;
  }
}

}  // namespace

void decode_argmax_rows(const float* logits, int64_t rows, int64_t V, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  TREX_CHECK(V >= 1 && V < (int64_t(1) << 31), "decode_argmax_rows: vocabulary {} unsupported", V);
  argmax_rows_kernel<<<unsigned(rows), 1024, 0, s>>>(logits, V, out);
  TREX_CUDA_LAUNCHED();
}

void decode_compress_entries(const DecodeStep& st, const DecodeCompress& a, cudaStream_t s) {
  if (a.n_entries == 0) return;
  TREX_CHECK(a.c <= 4096 && a.rope_dim % 2 == 0 && a.rope_dim <= a.c,
             "decode_compress_entries: entry width {} / rope_dim {} unsupported", a.c, a.rope_dim);
  compress_entries_kernel<<<unsigned(a.n_entries), kThreads, size_t(a.c) * sizeof(float), s>>>(st, a);
  TREX_CUDA_LAUNCHED();
}

void decode_store_rows(const DecodeStep& st, bf16* ring, const bf16* src, int64_t rows, int64_t width,
                       cudaStream_t s) {
  if (st.n_tok == 0) return;
  TREX_CHECK(width % 8 == 0, "decode_store_rows: width {} is not a multiple of 8", width);
  store_rows_kernel<<<unsigned(st.n_tok), 128, 0, s>>>(st, ring, src, rows, width);
  TREX_CUDA_LAUNCHED();
}

void decode_visible_ranges(const DecodeStep& st, int64_t ratio, int64_t cap, int64_t* vis_begin, int64_t* vis_end,
                           cudaStream_t s) {
  if (st.n_tok == 0) return;
  visible_ranges_kernel<<<unsigned((st.n_tok + 255) / 256), 256, 0, s>>>(st, ratio, cap, vis_begin, vis_end);
  TREX_CUDA_LAUNCHED();
}

void decode_attention(const DecodeStep& st, const DecodeAttention& a, cudaStream_t s) {
  if (st.n_tok == 0) return;
  TREX_CHECK(a.c == 256 || a.c == 512, "decode_attention: head dim {} unsupported (256 or 512)", a.c);
  constexpr int kWarps = 8;
  const dim3 grid(unsigned(st.n_tok), unsigned((a.heads + kWarps - 1) / kWarps));
  TREX_CHECK(a.keys_per_iter == 1 || a.keys_per_iter == 4, "decode_attention: keys_per_iter {} unsupported (1 or 4)",
             a.keys_per_iter);
  if (a.c == 256 && a.keys_per_iter == 4)
    attention_kernel<1, 4><<<grid, kWarps * 32, 0, s>>>(st, a);
  else if (a.c == 256)
    attention_kernel<1, 1><<<grid, kWarps * 32, 0, s>>>(st, a);
  else if (a.keys_per_iter == 4)
    attention_kernel<2, 4><<<grid, kWarps * 32, 0, s>>>(st, a);
  else
    attention_kernel<2, 1><<<grid, kWarps * 32, 0, s>>>(st, a);
  TREX_CUDA_LAUNCHED();
}

void decode_key_sets(const DecodeStep& st, const DecodeKeySets& a, cudaStream_t s) {
  if (st.n_tok == 0) return;
  TREX_CHECK(a.window >= 1 && a.n_hist >= 0 && a.n_hist < a.window && a.n_cmp >= 0,
             "decode_key_sets: window {} / history columns {} / compressed columns {} inconsistent", a.window,
             a.n_hist, a.n_cmp);
  TREX_CHECK(a.n_hist + a.n_cmp == 0 || a.cols, "decode_key_sets: {} columns but no output", a.n_hist + a.n_cmp);
  TREX_CHECK(a.n_cmp == 0 || (a.sel ? a.n_cmp <= a.k_sel : a.ratio > 0 && a.cap > 0),
             "decode_key_sets: {} compressed columns need a selection of >= that many (k_sel {}) or a ratio ({})",
             a.n_cmp, a.k_sel, a.ratio);
  key_sets_kernel<<<unsigned(st.n_tok), 128, 0, s>>>(st, a);
  TREX_CUDA_LAUNCHED();
}

void decode_last_rows(const DecodeStep& st, const bf16* x, int64_t width, bf16* out, cudaStream_t s) {
  if (st.n_items == 0) return;
  TREX_CHECK(width % 8 == 0, "decode_last_rows: width {} is not a multiple of 8", width);
  last_rows_kernel<<<unsigned(st.n_items), 128, 0, s>>>(st, x, width, out);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
