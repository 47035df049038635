// The numbered versions of dev/grouped_gemm/README.md, for wgmma_bench.cu only: every configuration of the
// product's kernel templates that was measured, the product's own among them (m1, m3, v10: the configurations
// src/kernels/cuda/grouped_gemm.cu instantiates). Templates come from the product's internal headers
// (grouped_gemm_mma.cuh, grouped_gemm_sm90.cuh); nothing here is a copy of kernel code.
// Version ids: -1 .. -6 = mma.sync m1 .. m6, 1 .. 11 = sm90 v1 .. v11.
#pragma once
#include <string>

#include "kernels/cuda/grouped_gemm_mma.cuh"
#include "kernels/cuda/grouped_gemm_sm90.cuh"

namespace gg_dev {

using bf16 = __nv_bfloat16;
namespace sm90 = trex::cuda::sm90;
namespace mma = trex::cuda::mma_gg;
using sm90::Form;

// mma.sync: block tile BM x BN x BK, warp tile, stages, resident blocks per SM.
using M1 = mma::Cfg<128, 128, 32, 64, 32, 4, 2>;  // the product's MmaSmall
using M2 = mma::Cfg<128, 256, 32, 64, 64, 3, 1>;
using M3 = mma::Cfg<128, 256, 64, 64, 64, 3, 1>;  // the product's MmaLarge
using M4 = mma::Cfg<128, 256, 32, 64, 64, 4, 1>;
using M5 = mma::Cfg<128, 256, 64, 64, 64, 4, 1>;  // 221 KB shared memory
using M6 = mma::Cfg<256, 128, 64, 64, 64, 3, 1>;  // 8 warps as 4 x 2
constexpr int kMmaVersions = 6, kSm90Versions = 11;

inline bool is_product(int id) { return id == -1 || id == -3 || id == 10; }
inline std::string name(int id) { return (id < 0 ? "m" : "v") + std::to_string(id < 0 ? -id : id); }
// Clusters of two along N (the n-tiles must pair up) / along M (dw: the 128-row tiles of `out` must).
inline bool along_n(int id) { return id == 4 || id == 7; }
inline bool along_m(int id) { return id == 5 || id == 8; }
// Whether version id can run form F at these extents (the cluster versions need paired tiles).
inline bool runs(int id, Form f, int64_t in, int64_t out) {
  if (along_n(id)) return sm90::cluster_ok(f == Form::Fwd ? out : in, 256);
  if (along_m(id) && f == Form::Dw) return sm90::cluster_ok(out, sm90::kBM);
  return true;
}

template <Form F, class C>
cudaError_t run_mma_cfg(void* out, const bf16* a, const bf16* b, const int32_t* off, int32_t* ts, int64_t E,
                        int64_t rows, int64_t in, int64_t out_dim) {
  if constexpr (F == Form::Fwd)
    return mma::launch_rows<C, true>(static_cast<bf16*>(out), a, b, off, E, rows, out_dim, in, ts, nullptr);
  else if constexpr (F == Form::Dx)
    return mma::launch_rows<C, false>(static_cast<bf16*>(out), a, b, off, E, rows, in, out_dim, ts, nullptr);
  else
    return mma::launch_dw<C>(static_cast<float*>(out), a, b, off, E, in, out_dim, nullptr);
}

// sm90: v1 = BN 256 / 4 stages, v2 = 3 stages, v3 = BN 128 / 6 stages, v4 / v5 = v1 in clusters of 2 along N
// (A multicast) / M (B multicast), v6 / v7 / v8 = v1 / v4 / v5 with the epilogue staged through shared memory,
// v9 = v3 staged, v10 = v6 with dw by L2 reductions (the product), v11 = v1 with dw by L2 reductions.
template <Form F>
cudaError_t run_sm90(int v, void* out, const bf16* a, const bf16* b, const int32_t* off, const int32_t* ts,
                     int64_t E, int64_t rows, int64_t in, int64_t o, int n_group) {
  switch (v) {
    case 1: return sm90::launch<F, 256, 4>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 2: return sm90::launch<F, 256, 3>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 3: return sm90::launch<F, 128, 6>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 4: return sm90::launch<F, 256, 4, 2>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 5: return sm90::launch<F, 256, 4, 2, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 6: return sm90::launch<F, 256, 4, 1, false, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 7: return sm90::launch<F, 256, 4, 2, false, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 8: return sm90::launch<F, 256, 4, 2, true, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 9: return sm90::launch<F, 128, 6, 1, false, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 10:
      return sm90::launch<F, 256, 4, 1, false, true, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    case 11:
      return sm90::launch<F, 256, 4, 1, false, false, true>(out, a, b, off, ts, E, rows, in, o, nullptr, n_group);
    default: return cudaErrorInvalidValue;
  }
}

// Runs version id in form F: out = y (fwd), dx (dx) or dW (dw, accumulated); a, b = (x, W), (dy, W), (dy, x).
// ts: E + 1 int32 of scratch (the m-tile prefix of fwd / dx). n_group: the sm90 fwd / dx walk's n-tile groups.
template <Form F>
cudaError_t run_version(int id, void* out, const bf16* a, const bf16* b, const int32_t* off, int32_t* ts, int64_t E,
                        int64_t rows, int64_t in, int64_t o, int n_group = sm90::kNGroup) {
  switch (id) {
    case -1: return run_mma_cfg<F, M1>(out, a, b, off, ts, E, rows, in, o);
    case -2: return run_mma_cfg<F, M2>(out, a, b, off, ts, E, rows, in, o);
    case -3: return run_mma_cfg<F, M3>(out, a, b, off, ts, E, rows, in, o);
    case -4: return run_mma_cfg<F, M4>(out, a, b, off, ts, E, rows, in, o);
    case -5: return run_mma_cfg<F, M5>(out, a, b, off, ts, E, rows, in, o);
    case -6: return run_mma_cfg<F, M6>(out, a, b, off, ts, E, rows, in, o);
    default: break;
  }
  if (!runs(id, F, in, o)) return cudaErrorNotSupported;
  if (F != Form::Dw) {
    const int bm = along_m(id) ? sm90::prefix_rows<2, true>() : sm90::kBM;
    sm90::tile_prefix_kernel<<<1, sm90::kPrefixThreads>>>(off, int(E), bm, ts);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return run_sm90<F>(id, out, a, b, off, ts, E, rows, in, o, n_group);
}

}  // namespace gg_dev
