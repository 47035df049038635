// Sparse MQA kernels at the model's shapes (llm.c's dev/cuda style): every kernel version on the same data,
// checked and timed. v1 = CUDA-core fp32 kernels (SparseAttnKernel::CudaCore), prod = the production dispatch
// (SparseAttnKernel::TensorCore: attention_sparse_mma.cu picks a kernel per shape); numbered tensor-core variants
// (sparse_variants.h, built from the product's templates in attention_sparse_mma.cuh): forward v2 Keys32 (32-key
// tiles), v3 Keys64, v4 Keys64Warps4, v5 MultiQuery (H <= 32), v6 SplitDims (4 warps per 16 heads, each c / 4
// dims; P in registers), v7 SplitDims32 (v6 with <= 32 heads per block), v8 = v4, v9 = v5, v10 = v3 with key
// sources prefetched two tiles ahead, v11 = sm_90a wgmma (64 heads per block, two warpgroups), v12 = v11 with S
// split over the warpgroups by dims; backward v2 Keys32, v5 MultiQuery, v6 SplitDims (16 heads per block), v7
// SplitDims32 (32 heads per block when H > 16), v8 = v2 and v9 = v5 prefetched, v13 = the product's backward
// dispatch with fp32 atomics (the product before its backward became deterministic). Production: forward v11
// (H > 32), v6 (H <= 32); backward v8 (H > 32), v6 (CSA) and v9 (window / HCA) when H <= 32, each block storing its
// dK + dV rows and a fixed-order reduction summing them (attention_dkv_reduce.h; the numbered backward versions use
// atomics). "TIME ... prod ... bwd" vs "TIME ... v13 bwd" is the cost of determinism; prod's backward runs twice
// more and must give the same bits ("prod bwd bitwise" line). ATTN_VARIANTS=2,6 runs only
// those; ATTN_V1=0 skips v1 (and the whole-problem prod vs v1 check).
// Cases at N tokens, H heads, head dim c:
//   sliding  window of 128 rows only;
//   csa      window + k_sel = 512 selected entries among the causally visible ones of E = N / 4 (ratio 4;
//            slots past the visible count are -1, as the indexer leaves them);
//   hca      window + the dense visible range of E = N / 128 entries (ratio 128).
// Checks: o / lse / dq of sampled queries against a double-precision reference computed here (o, dq relative
// L2 < 2e-2 / 1e-2; lse < 1e-4) for every version, every output of prod against v1 over the whole problem, and of
// each variant against prod (dkv / dcmp / dsink have no per-query reference). TFLOP/s counts the work done: fwd 4 * H * c * keys per query (QK^T and PV), bwd
// 10 * H * c * keys (QK^T, dO V^T, dS K, dS^T Q, P^T dO), keys = window rows + compressed slots (empty slots
// are computed and masked, so they count).
// Indexer (CSA's lightning indexer top-k, q [N, 64, 128] x keys [E = N / 4, 128], causal visible ranges,
// k_sel = 512): v1 = CUDA-core scores (IndexerKernel::CudaCore), v2 = tensor-core scores; the selections of
// 16 sampled queries are checked against double scores (top-k invariant with tolerance 1e-4 x max |score|),
// the agreement of v1 and v2 is printed; TFLOP/s counts 2 * 64 * 128 per visible (query, entry) pair.
// Build + run: dev/attention/device.sh (nvcc -arch=sm_90a, with sparse_variants.cu; no CMake). Usage: attention_bench [N] [H] [c] [reps]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/indexer.h"
#include "sparse_variants.h"

using trex::cuda::bf16;
using trex::cuda::SparseAttnKernel;

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::printf("FAIL cuda error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

int g_failures = 0;

__host__ __device__ inline float hash_uniform(uint64_t x) {  // splitmix64 -> [-sqrt3, sqrt3): unit variance
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (float((x >> 40) & 0xFFFFFF) / 16777216.f * 2.f - 1.f) * 1.7320508f;
}

__global__ void fill_kernel(bf16* x, int64_t n, uint64_t seed) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
    x[k] = __float2bfloat16(hash_uniform(seed * 0x100000000ull + uint64_t(k)));
}

template <typename T>
T* dalloc(int64_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
  return p;
}
template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = dalloc<T>(int64_t(v.size()));
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> download(const T* p, int64_t n) {
  std::vector<T> v(size_t(std::max<int64_t>(n, 0)));
  CK(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
float bf(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<uint16_t> download_bits(const bf16* p, int64_t n) {
  return download(reinterpret_cast<const uint16_t*>(p), n);
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
std::vector<float> bf_vec(const bf16* p, int64_t n) {
  std::vector<uint16_t> b = download(reinterpret_cast<const uint16_t*>(p), n);
  std::vector<float> f(b.size());
  for (size_t k = 0; k < b.size(); ++k) f[k] = bf(b[k]);
  return f;
}
double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t k = 0; k < ref.size(); ++k) {
    if (!std::isfinite(a[k])) return INFINITY;
    num += (double(a[k]) - ref[k]) * (double(a[k]) - ref[k]);
    den += double(ref[k]) * ref[k];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
// rel_l2 of two [N, row] bf16 tensors over their first and last N / 16 rows (the variants' cheap whole-run check).
double rel_l2_ends(const bf16* a, const bf16* b, int64_t N, int64_t row) {
  const int64_t n = std::max<int64_t>(N / 16, 1) * row, off = N * row - n;
  std::vector<float> x = bf_vec(a, n), y = bf_vec(b, n), x2 = bf_vec(a + off, n), y2 = bf_vec(b + off, n);
  x.insert(x.end(), x2.begin(), x2.end());
  y.insert(y.end(), y2.begin(), y2.end());
  return rel_l2(x, y);
}
void check(const std::string& what, double err, double tol) {
  const bool ok = err < tol;
  if (!ok) ++g_failures;
  std::printf("%s %s rel_l2=%.3e (tol %.0e)\n", ok ? "PASS" : "FAIL", what.c_str(), err, tol);
}

struct Problem {
  std::string name;
  int64_t N, H, c, E, k_sel;
  std::vector<int64_t> win_begin, cmp_begin, cmp_end, sel;  // sel empty = dense ranges (or none)
  double keys_total = 0;
};

Problem make_problem(const std::string& name, int64_t N, int64_t H, int64_t c) {
  Problem p{name, N, H, c, 0, 0, {}, {}, {}, {}, 0};
  p.win_begin.resize(N);
  for (int64_t i = 0; i < N; ++i) p.win_begin[i] = std::max<int64_t>(0, i - 127);
  if (name == "csa") {
    const int64_t ratio = 4;
    p.E = N / ratio, p.k_sel = 512;
    p.sel.assign(size_t(N * p.k_sel), -1);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t vis = (i + 1) / ratio;  // entries whose whole window precedes or includes i
      for (int64_t s = 0; s < std::min(vis, p.k_sel); ++s) {
        // A spread-out, query-dependent selection (distinct entries: a stride coprime with small vis is fine).
        p.sel[size_t(i * p.k_sel + s)] = vis <= p.k_sel ? s : (s * 7919 + i * 31) % vis;
      }
    }
  } else if (name == "hca") {
    const int64_t ratio = 128;
    p.E = N / ratio;
    p.cmp_begin.assign(N, 0);
    p.cmp_end.resize(N);
    for (int64_t i = 0; i < N; ++i) p.cmp_end[i] = (i + 1) / ratio;
  }
  for (int64_t i = 0; i < N; ++i)
    p.keys_total += double(i - p.win_begin[i] + 1) +
                    (p.sel.empty() ? (p.cmp_end.empty() ? 0.0 : double(p.cmp_end[i] - p.cmp_begin[i])) : p.k_sel);
  return p;
}

// Double-precision reference for query i: o [H, c], lse [H], dq [H, c] (dq needs do_ and the reference o).
void reference(const Problem& p, int64_t i, const std::vector<float>& qi, const std::vector<float>& kv,
               const std::vector<float>& cmp, const std::vector<float>& sink, const std::vector<float>& doi,
               std::vector<float>& o, std::vector<float>& lse, std::vector<float>& dq) {
  const int64_t H = p.H, c = p.c;
  std::vector<const float*> keys;
  for (int64_t r = p.win_begin[i]; r <= i; ++r) keys.push_back(&kv[size_t(r * c)]);
  if (!p.sel.empty()) {
    for (int64_t s = 0; s < p.k_sel; ++s) {
      const int64_t e = p.sel[size_t(i * p.k_sel + s)];
      if (e >= 0) keys.push_back(&cmp[size_t(e * c)]);
    }
  } else if (!p.cmp_end.empty()) {
    for (int64_t e = p.cmp_begin[i]; e < p.cmp_end[i]; ++e) keys.push_back(&cmp[size_t(e * c)]);
  }
  const double scale = 1.0 / std::sqrt(double(c));
  o.assign(size_t(H * c), 0.f), lse.assign(size_t(H), 0.f), dq.assign(size_t(H * c), 0.f);
  std::vector<double> z(keys.size()), acc(static_cast<size_t>(c));
  for (int64_t h = 0; h < H; ++h) {
    const float* q = &qi[size_t(h * c)];
    const float* d = &doi[size_t(h * c)];
    double mx = sink[size_t(h)];
    for (size_t j = 0; j < keys.size(); ++j) {
      double s = 0;
      for (int64_t k = 0; k < c; ++k) s += double(q[k]) * keys[j][k];
      z[j] = s * scale;
      mx = std::max(mx, z[j]);
    }
    double den = std::exp(sink[size_t(h)] - mx);
    for (size_t j = 0; j < keys.size(); ++j) den += std::exp(z[j] - mx);
    const double L = mx + std::log(den);
    lse[size_t(h)] = float(L);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (size_t j = 0; j < keys.size(); ++j) {
      const double pj = std::exp(z[j] - L);
      for (int64_t k = 0; k < c; ++k) acc[size_t(k)] += pj * keys[j][k];
    }
    double D = 0;
    for (int64_t k = 0; k < c; ++k) {
      o[size_t(h * c + k)] = float(acc[size_t(k)]);
      D += acc[size_t(k)] * d[k];
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (size_t j = 0; j < keys.size(); ++j) {
      double dpj = 0;
      for (int64_t k = 0; k < c; ++k) dpj += double(d[k]) * keys[j][k];
      const double ds = std::exp(z[j] - L) * (dpj - D) * scale;
      for (int64_t k = 0; k < c; ++k) acc[size_t(k)] += ds * keys[j][k];
    }
    for (int64_t k = 0; k < c; ++k) dq[size_t(h * c + k)] = float(acc[size_t(k)]);
  }
}

struct Outputs {
  bf16 *o, *dq;
  float *lse, *dkv, *dcmp, *dsink, *scratch;
};

void run_case(const Problem& p, int reps) {
  const int64_t N = p.N, H = p.H, c = p.c, E = p.E;
  std::printf("== case %s: N=%lld H=%lld c=%lld E=%lld k_sel=%lld avg keys/query=%.1f\n", p.name.c_str(),
              (long long)N, (long long)H, (long long)c, (long long)E, (long long)p.k_sel, p.keys_total / N);
  bf16* q = dalloc<bf16>(N * H * c);
  bf16* kv = dalloc<bf16>(N * c);
  bf16* cmp = dalloc<bf16>(E * c);
  bf16* dout = dalloc<bf16>(N * H * c);
  fill_kernel<<<1024, 256>>>(q, N * H * c, 1);
  fill_kernel<<<1024, 256>>>(kv, N * c, 2);
  if (E) fill_kernel<<<1024, 256>>>(cmp, E * c, 3);
  fill_kernel<<<1024, 256>>>(dout, N * H * c, 4);
  std::vector<float> sink(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) sink[size_t(h)] = hash_uniform(uint64_t(5000 + h));
  float* d_sink = upload(sink);
  int64_t* d_wb = upload(p.win_begin);
  int64_t* d_cb = p.cmp_begin.empty() ? nullptr : upload(p.cmp_begin);
  int64_t* d_ce = p.cmp_end.empty() ? nullptr : upload(p.cmp_end);
  int64_t* d_sel = p.sel.empty() ? nullptr : upload(p.sel);
  trex::cuda::SparseKeySets ks;
  ks.win_begin = d_wb, ks.cmp_begin = d_cb, ks.cmp_end = d_ce, ks.cmp_sel = d_sel, ks.k_sel = p.k_sel;
  ks.max_win = 128;  // make_problem's window

  const SparseAttnKernel versions[2] = {SparseAttnKernel::CudaCore, SparseAttnKernel::TensorCore};
  Outputs out[2];
  for (int v = 0; v < 2; ++v) {
    Outputs& x = out[v];
    x.o = dalloc<bf16>(N * H * c), x.dq = dalloc<bf16>(N * H * c), x.lse = dalloc<float>(N * H);
    x.dkv = dalloc<float>(N * c), x.dcmp = dalloc<float>(E * c), x.dsink = dalloc<float>(H);
    const int64_t scratch = trex::cuda::sparse_attention_bwd_scratch(N, E, H, c, ks, versions[v]);
    x.scratch = dalloc<float>(scratch);
    if (v == 1) std::printf("INFO %s prod bwd scratch %.1f MiB\n", p.name.c_str(), double(scratch) * 4 / (1 << 20));
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const double fwd_flop = 4.0 * H * c * p.keys_total, bwd_flop = 10.0 * H * c * p.keys_total;
  const bool with_v1 = !std::getenv("ATTN_V1") || std::string(std::getenv("ATTN_V1")) != "0";  // ATTN_V1=0: skip v1
  for (int v = with_v1 ? 0 : 1; v < 2; ++v) {
    Outputs& x = out[v];
    auto fwd = [&] {
      trex::cuda::sparse_attention_fwd(q, kv, cmp, d_sink, N, H, c, ks, x.o, x.lse, nullptr, versions[v]);
    };
    auto bwd = [&] {
      trex::cuda::sparse_attention_bwd(q, kv, cmp, d_sink, N, E, H, c, ks, x.o, x.lse, dout, x.dq, x.dkv,
                                       x.dcmp, x.dsink, x.scratch, nullptr, versions[v]);
    };
    fwd();
    CK(cudaMemset(x.dkv, 0, size_t(N * c) * 4));
    if (E) CK(cudaMemset(x.dcmp, 0, size_t(E * c) * 4));
    CK(cudaMemset(x.dsink, 0, size_t(H) * 4));
    bwd();  // the accumulated outputs of exactly one backward are compared below
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r) fwd();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms_f = 0;
    CK(cudaEventElapsedTime(&ms_f, e0, e1));
    ms_f /= reps;
    // Timed backwards accumulate into scratch copies' targets; dkv etc. were saved by the first call above.
    float *dkv_t = dalloc<float>(N * c), *dcmp_t = dalloc<float>(E * c), *dsink_t = dalloc<float>(H);
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r)
      trex::cuda::sparse_attention_bwd(q, kv, cmp, d_sink, N, E, H, c, ks, x.o, x.lse, dout, x.dq, dkv_t, dcmp_t,
                                       dsink_t, x.scratch, nullptr, versions[v]);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms_b = 0;
    CK(cudaEventElapsedTime(&ms_b, e0, e1));
    ms_b /= reps;
    CK(cudaFree(dkv_t));
    CK(cudaFree(dcmp_t));
    CK(cudaFree(dsink_t));
    std::printf("TIME %s %s fwd %.3f ms = %.1f TFLOP/s | bwd %.3f ms = %.1f TFLOP/s\n", p.name.c_str(),
                v == 0 ? "v1" : "prod", ms_f, fwd_flop / (ms_f * 1e-3) / 1e12, ms_b, bwd_flop / (ms_b * 1e-3) / 1e12);
    // Determinism: two more backwards into fresh zeroed outputs give the first one's bits.
    {
      const std::vector<uint16_t> dq0 = download_bits(x.dq, N * H * c);
      const std::vector<float> dkv0 = download(x.dkv, N * c), dcmp0 = download(x.dcmp, E * c),
                               dsink0 = download(x.dsink, H);
      bool same = true;
      for (int r = 0; r < 2; ++r) {
        float *a = dalloc<float>(N * c), *b = dalloc<float>(E * c), *d = dalloc<float>(H);
        bf16* g = dalloc<bf16>(N * H * c);
        CK(cudaMemset(a, 0, size_t(N * c) * 4));
        if (E) CK(cudaMemset(b, 0, size_t(E * c) * 4));
        CK(cudaMemset(d, 0, size_t(H) * 4));
        trex::cuda::sparse_attention_bwd(q, kv, cmp, d_sink, N, E, H, c, ks, x.o, x.lse, dout, g, a, b, d, x.scratch,
                                         nullptr, versions[v]);
        CK(cudaDeviceSynchronize());
        same = same && download_bits(g, N * H * c) == dq0 && same_bits(download(a, N * c), dkv0) &&
               same_bits(download(b, E * c), dcmp0) && same_bits(download(d, H), dsink0);
        for (void* ptr : {(void*)a, (void*)b, (void*)d, (void*)g}) CK(cudaFree(ptr));
      }
      if (!same) ++g_failures;
      std::printf("%s %s %s bwd bitwise identical over 3 runs (dq, dkv, dcmp, dsink)\n", same ? "PASS" : "FAIL",
                  p.name.c_str(), v == 0 ? "v1" : "prod");
    }
  }

  // Reference on sampled queries (first, last, spread).
  const std::vector<float> kv_h = bf_vec(kv, N * c), cmp_h = bf_vec(cmp, E * c);
  std::vector<int64_t> sample = {0, 1, 5, 127, 128, 129, N / 3, N / 2 + 7, N - 2, N - 1};
  for (int k = 0; k < 6; ++k) sample.push_back((int64_t(k) * 1237 + 611) % N);
  std::vector<float> ref_o, ref_l, ref_dq;
  for (int64_t i : sample) {
    const std::vector<float> qi = bf_vec(q + i * H * c, H * c), doi = bf_vec(dout + i * H * c, H * c);
    std::vector<float> o, lse, dq;
    reference(p, i, qi, kv_h, cmp_h, sink, doi, o, lse, dq);
    ref_o.insert(ref_o.end(), o.begin(), o.end());
    ref_l.insert(ref_l.end(), lse.begin(), lse.end());
    ref_dq.insert(ref_dq.end(), dq.begin(), dq.end());
  }
  // The sampled rows of a device [N, H, c] bf16 / [N, H] fp32 output, in the reference's order.
  auto sampled_bf = [&](const bf16* x) {
    std::vector<float> r;
    for (int64_t i : sample) {
      const std::vector<float> v = bf_vec(x + i * H * c, H * c);
      r.insert(r.end(), v.begin(), v.end());
    }
    return r;
  };
  auto sampled_f = [&](const float* x) {
    std::vector<float> r;
    for (int64_t i : sample) {
      const std::vector<float> v = download(x + i * H, H);
      r.insert(r.end(), v.begin(), v.end());
    }
    return r;
  };
  auto time_ms = [&](const std::function<void()>& f) {
    f();
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r) f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / reps;
  };
  const char* only_v = std::getenv("ATTN_VARIANTS");  // e.g. "2,6": run only these numbered variants

  // Forward variants of the tensor-core kernel (sparse_variants.h FwdTiling): v2 Keys32, v3 Keys64, v4
  // Keys64Warps4, v5 MultiQuery, v6 SplitDims, v7 SplitDims32; each checked against the double reference (sampled
  // queries) and against the production dispatch (first + last N/16 queries).
  using trex::cuda::mma_attn::variants::BwdTiling;
  using trex::cuda::mma_attn::variants::FwdTiling;
  const struct {
    int v;
    FwdTiling tiling;
  } fwd_variants[] = {{2, FwdTiling::Keys32},    {3, FwdTiling::Keys64},    {4, FwdTiling::Keys64Warps4},
                      {5, FwdTiling::MultiQuery}, {6, FwdTiling::SplitDims}, {7, FwdTiling::SplitDims32},
                      {8, FwdTiling::Keys64Warps4Prefetch}, {9, FwdTiling::MultiQueryPrefetch},
                      {10, FwdTiling::Keys64Prefetch}, {11, FwdTiling::Wgmma},
                      {12, FwdTiling::WgmmaSplitS}};
  auto wanted = [&](int v) {
    return !only_v || (std::string(",") + only_v + ",").find("," + std::to_string(v) + ",") != std::string::npos;
  };
  for (const auto& fv : fwd_variants) {
    if (!wanted(fv.v)) continue;
    bf16* o3 = dalloc<bf16>(N * H * c);
    float* l3 = dalloc<float>(N * H);
    const float ms = time_ms(
        [&] { trex::cuda::mma_attn::variants::fwd(q, kv, cmp, d_sink, N, H, c, ks, o3, l3, nullptr, fv.tiling); });
    std::printf("TIME %s v%d fwd %.3f ms = %.1f TFLOP/s\n", p.name.c_str(), fv.v, ms, fwd_flop / (ms * 1e-3) / 1e12);
    const std::string tag = p.name + " v" + std::to_string(fv.v) + " fwd ";
    check(tag + "vs reference (16 queries) o", rel_l2(sampled_bf(o3), ref_o), 1e-2);
    check(tag + "vs reference (16 queries) lse", rel_l2(sampled_f(l3), ref_l), 1e-4);
    check(tag + "vs prod (first + last N/16 queries) o", rel_l2_ends(o3, out[1].o, N, H * c), 1e-2);
    check(tag + "vs prod (all) lse", rel_l2(download(l3, N * H), download(out[1].lse, N * H)), 1e-4);
    CK(cudaFree(o3));
    CK(cudaFree(l3));
  }
  // Backward variants (BwdTiling): v2 Keys32, v5 MultiQuery, v6 SplitDims; from prod's o / lse; dq checked against
  // the reference (sampled) and prod (ends), dkv / dcmp / dsink (summed partials) against prod (all).
  const struct {
    int v;
    BwdTiling tiling;
  } bwd_variants[] = {{2, BwdTiling::Keys32}, {5, BwdTiling::MultiQuery}, {6, BwdTiling::SplitDims},
                      {7, BwdTiling::SplitDims32}, {8, BwdTiling::Keys32Prefetch},
                      {9, BwdTiling::MultiQueryPrefetch}, {13, BwdTiling::AtomicProd}};
  const std::vector<float> prod_dkv = download(out[1].dkv, N * c), prod_dcmp = download(out[1].dcmp, E * c),
                           prod_dsink = download(out[1].dsink, H);
  for (const auto& bv : bwd_variants) {
    if (!wanted(bv.v)) continue;
    bf16* dq5 = dalloc<bf16>(N * H * c);
    float *dkv5 = dalloc<float>(N * c), *dcmp5 = dalloc<float>(E * c), *part5 = dalloc<float>(N * H);
    auto bwd5 = [&] {
      trex::cuda::mma_attn::variants::bwd(q, kv, cmp, d_sink, N, H, c, ks, out[1].o, out[1].lse, dout, dq5, dkv5,
                                          dcmp5, part5, nullptr, bv.tiling);
    };
    CK(cudaMemset(dkv5, 0, size_t(N * c) * 4));
    if (E) CK(cudaMemset(dcmp5, 0, size_t(E * c) * 4));
    bwd5();
    CK(cudaDeviceSynchronize());
    const std::vector<float> dkv_once = download(dkv5, N * c), dcmp_once = download(dcmp5, E * c);
    const std::vector<float> part_h = download(part5, N * H);
    std::vector<float> dsink5(size_t(H), 0.f);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) dsink5[size_t(h)] += part_h[size_t(i * H + h)];
    const float ms = time_ms(bwd5);
    std::printf("TIME %s v%d bwd %.3f ms = %.1f TFLOP/s\n", p.name.c_str(), bv.v, ms, bwd_flop / (ms * 1e-3) / 1e12);
    const std::string tag = p.name + " v" + std::to_string(bv.v) + " bwd ";
    check(tag + "vs reference (16 queries) dq", rel_l2(sampled_bf(dq5), ref_dq), 2e-2);
    check(tag + "vs prod (first + last N/16 queries) dq", rel_l2_ends(dq5, out[1].dq, N, H * c), 2e-2);
    check(tag + "vs prod (all) dkv", rel_l2(dkv_once, prod_dkv), 1e-2);
    if (E) check(tag + "vs prod (all) dcmp", rel_l2(dcmp_once, prod_dcmp), 1e-2);
    check(tag + "vs prod dsink", rel_l2(dsink5, prod_dsink), 1e-2);
    if (bv.v == 13) {  // the atomic backward: how often two runs differ (informational)
      CK(cudaMemset(dkv5, 0, size_t(N * c) * 4));
      if (E) CK(cudaMemset(dcmp5, 0, size_t(E * c) * 4));
      bwd5();
      CK(cudaDeviceSynchronize());
      const std::vector<float> dkv_2 = download(dkv5, N * c), dcmp_2 = download(dcmp5, E * c);
      int64_t diff = 0;
      for (size_t k = 0; k < dkv_2.size(); ++k) diff += std::memcmp(&dkv_2[k], &dkv_once[k], 4) != 0;
      for (size_t k = 0; k < dcmp_2.size(); ++k) diff += std::memcmp(&dcmp_2[k], &dcmp_once[k], 4) != 0;
      std::printf("INFO %s v13 (atomic) bwd: %lld of %zu dkv + dcmp elements differ between two runs\n",
                  p.name.c_str(), (long long)diff, dkv_2.size() + dcmp_2.size());
    }
    for (void* ptr : {(void*)dq5, (void*)dkv5, (void*)dcmp5, (void*)part5}) CK(cudaFree(ptr));
  }

  for (int v = with_v1 ? 0 : 1; v < 2; ++v) {
    const std::string tag = p.name + (v == 0 ? " v1" : " prod") + " vs reference (16 queries) ";
    check(tag + "o", rel_l2(sampled_bf(out[v].o), ref_o), 1e-2);
    check(tag + "lse", rel_l2(sampled_f(out[v].lse), ref_l), 1e-4);
    check(tag + "dq", rel_l2(sampled_bf(out[v].dq), ref_dq), 2e-2);
  }
  const std::string tag = p.name + " prod vs v1 (all queries) ";
  if (with_v1) {
    check(tag + "o", rel_l2(bf_vec(out[1].o, N * H * c), bf_vec(out[0].o, N * H * c)), 1e-2);
    check(tag + "lse", rel_l2(download(out[1].lse, N * H), download(out[0].lse, N * H)), 1e-4);
    check(tag + "dq", rel_l2(bf_vec(out[1].dq, N * H * c), bf_vec(out[0].dq, N * H * c)), 2e-2);
    check(tag + "dkv", rel_l2(download(out[1].dkv, N * c), download(out[0].dkv, N * c)), 1e-2);
    if (E) check(tag + "dcmp", rel_l2(download(out[1].dcmp, E * c), download(out[0].dcmp, E * c)), 1e-2);
    check(tag + "dsink", rel_l2(download(out[1].dsink, H), download(out[0].dsink, H)), 1e-2);
  }

  for (auto& x : out) {
    for (void* ptr : {(void*)x.o, (void*)x.dq, (void*)x.lse, (void*)x.dkv, (void*)x.dcmp, (void*)x.dsink,
                      (void*)x.scratch})
      CK(cudaFree(ptr));
  }
  for (void* ptr : {(void*)q, (void*)kv, (void*)cmp, (void*)dout, (void*)d_sink, (void*)d_wb, (void*)d_cb,
                    (void*)d_ce, (void*)d_sel})
    if (ptr) CK(cudaFree(ptr));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}


void run_indexer(int64_t N, int64_t NI, int64_t CI, int reps) {
  const int64_t ratio = 4, E = N / ratio, k = 512;
  std::vector<int64_t> vb(static_cast<size_t>(N), 0), ve(static_cast<size_t>(N));
  double pairs = 0;
  int64_t max_vis = 0;
  for (int64_t i = 0; i < N; ++i) {
    ve[size_t(i)] = (i + 1) / ratio;
    pairs += double(ve[size_t(i)]);
    max_vis = std::max(max_vis, ve[size_t(i)]);
  }
  std::printf("== indexer: N=%lld NI=%lld CI=%lld E=%lld k_sel=%lld avg visible=%.1f\n", (long long)N,
              (long long)NI, (long long)CI, (long long)E, (long long)k, pairs / N);
  bf16* q = dalloc<bf16>(N * NI * CI);
  bf16* keys = dalloc<bf16>(E * CI);
  fill_kernel<<<1024, 256>>>(q, N * NI * CI, 11);
  fill_kernel<<<1024, 256>>>(keys, E * CI, 12);
  std::vector<float> w(size_t(N * NI));
  for (size_t j = 0; j < w.size(); ++j) w[j] = hash_uniform(900000 + j);
  float* d_w = upload(w);
  int64_t* d_vb = upload(vb);
  int64_t* d_ve = upload(ve);
  int64_t* sel[2] = {dalloc<int64_t>(N * k), dalloc<int64_t>(N * k)};
  trex::cuda::IndexerTopkArgs a;
  a.n_tok = N, a.n_heads = NI, a.head_dim = CI, a.k_sel = k, a.max_visible = max_vis;
  a.w_scale = float(1.0 / std::sqrt(double(NI))), a.vis_begin = d_vb, a.vis_end = d_ve;
  const trex::cuda::IndexerKernel kinds[2] = {trex::cuda::IndexerKernel::CudaCore, trex::cuda::IndexerKernel::Auto};
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int v = 0; v < 2; ++v) {
    trex::cuda::indexer_topk(sel[v], q, d_w, keys, a, nullptr, kinds[v]);
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r) trex::cuda::indexer_topk(sel[v], q, d_w, keys, a, nullptr, kinds[v]);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= reps;
    std::printf("TIME indexer v%d %.3f ms = %.1f TFLOP/s (scores + top-k)\n", v + 1, ms,
                2.0 * NI * CI * pairs / (ms * 1e-3) / 1e12);
  }
  const std::vector<int64_t> s1 = download(sel[0], N * k), s2 = download(sel[1], N * k);
  int64_t same = 0;
  for (int64_t i = 0; i < N; ++i) {
    std::vector<int64_t> x(s1.begin() + i * k, s1.begin() + (i + 1) * k), y(s2.begin() + i * k, s2.begin() + (i + 1) * k);
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    same += x == y;
  }
  std::printf("INFO indexer v1/v2 identical selected sets: %lld of %lld queries\n", (long long)same, (long long)N);
  const std::vector<float> keys_h = bf_vec(keys, E * CI);
  int bad = 0;
  for (int64_t i : {int64_t(3), int64_t(100), int64_t(2047), int64_t(2051), N / 2, N - 1, N / 3 + 5, N - 700}) {
    const std::vector<float> qi = bf_vec(q + i * NI * CI, NI * CI);
    const int64_t nv = ve[size_t(i)], take = std::min(k, nv);
    std::vector<double> r(static_cast<size_t>(nv));
    double amax = 0;
    for (int64_t s = 0; s < nv; ++s) {
      double score = 0;
      for (int64_t h = 0; h < NI; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < CI; ++d) dot += double(qi[size_t(h * CI + d)]) * keys_h[size_t(s * CI + d)];
        score += double(w[size_t(i * NI + h)]) * a.w_scale * std::max(dot, 0.0);
      }
      r[size_t(s)] = score / std::sqrt(double(CI));
      amax = std::max(amax, std::abs(r[size_t(s)]));
    }
    std::vector<double> sorted = r;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double cut = take ? sorted[size_t(take - 1)] : 0, tol = 1e-4 * amax;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = s2[size_t(i * k + j)];
      if (j >= take) {
        bad += e != -1;
      } else {
        bad += !(e >= 0 && e < nv) || r[size_t(e)] < cut - tol;
      }
    }
  }
  if (bad) ++g_failures;
  std::printf("%s indexer v2 top-k vs double scores (8 queries): %d bad slots\n", bad ? "FAIL" : "PASS", bad);
  for (void* ptr : {(void*)q, (void*)keys, (void*)d_w, (void*)d_vb, (void*)d_ve, (void*)sel[0], (void*)sel[1]})
    CK(cudaFree(ptr));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int64_t H = argc > 2 ? std::atoll(argv[2]) : 64;
  const int64_t c = argc > 3 ? std::atoll(argv[3]) : 512;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  const char* only = std::getenv("ATTN_CASE");
  for (const char* name : {"csa", "sliding", "hca"}) {
    if (only && std::string(only) != name) continue;
    try {
      run_case(make_problem(name, N, H, c), reps);
    } catch (const std::exception& e) {
      std::printf("FAIL %s: %s\n", name, e.what());
      ++g_failures;
    }
  }
  if (!only || std::string(only) == "indexer") {
    try {
      run_indexer(N, H, 128, reps);
    } catch (const std::exception& e) {
      std::printf("FAIL indexer: %s\n", e.what());
      ++g_failures;
    }
  }
  std::printf("%s attention_bench: %d failed checks\n", g_failures ? "FAIL" : "PASS", g_failures);
  return g_failures ? 1 : 0;
}
