// Grouped expert GEMMs: the dispatch of grouped_gemm_dispatch.h over the kernels it runs. On Hopper the wgmma +
// TMA kernel (grouped_gemm_sm90.cuh) in its fastest measured configuration; elsewhere, for extents past its
// int32 coordinates and for the dw overload without a row count, the mma.sync kernel (grouped_gemm_mma.cuh)
// with one of two tile configurations. The measured alternatives live in dev/grouped_gemm.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_dispatch.h"
#include "kernels/cuda/grouped_gemm_mma.cuh"
#include "kernels/cuda/grouped_gemm_sm90.cuh"

namespace trex::cuda {
namespace grouped_gemm {
namespace {

// 128 x 128 tiles, 8 warps of 64 x 32, two blocks per SM; and 128 x 256 tiles with k steps of 64, 8 warps of
// 64 x 64, one block per SM (fewer shared-memory reads per mma, for large problems).
using CfgSmall = mma_gg::Cfg<128, 128, 32, 64, 32, 4, 2>;
using CfgLarge = mma_gg::Cfg<128, 256, 64, 64, 64, 3, 1>;
// The large tile pays off once there are enough of them to fill the GPU (about two waves of 132 SMs).
constexpr int64_t kLargeTiles = 264;

// The sm90 configuration: 128 x 256 tiles, 4 stages, no clusters, staged epilogue, dw by L2 reductions.
template <sm90::Form F>
cudaError_t launch_sm90(void* y, const bf16* a, const bf16* b, const int32_t* offsets, const int32_t* tile_start,
                        int64_t E, int64_t rows, int64_t in, int64_t out, cudaStream_t stream) {
  return sm90::launch<F, 256, 4, 1, false, true, true>(y, a, b, offsets, tile_start, E, rows, in, out, stream);
}

void check_dims(const char* what, int64_t n_groups, int64_t in, int64_t out) {
  TREX_CHECK(n_groups >= 1, "{}: {} expert groups", what, n_groups);
  TREX_CHECK(in > 0 && out > 0 && in % 8 == 0 && out % 8 == 0,
             "{}: in = {} and out = {} must be positive multiples of 8", what, in, out);
}

// Both kernels read and write whole 16-byte vectors of every operand (cp.async / TMA, the staged epilogue).
void check_aligned(const char* what, const void* o, const void* a, const void* b) {
  const auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  TREX_CHECK(al(o) && al(a) && al(b), "{}: output {}, operands {} and {} must be 16-byte aligned", what, o, a, b);
}

bool sm90_extents(int64_t rows, int64_t in, int64_t out, int64_t E) {
  return rows >= 0 && rows < (int64_t(1) << 31) && in < (1 << 30) && out < (1 << 30) &&
         in * out * E < (int64_t(1) << 40);
}

void check_sm90(const char* what, int64_t rows, int64_t in, int64_t out, int64_t E) {
  TREX_CHECK(sm90_device(), "{}: the sm90 path needs an sm_90 device and the driver's tensor-map encoder", what);
  TREX_CHECK(sm90_extents(rows, in, out, E), "{}: the sm90 path needs a row count and int32 extents (rows {}, "
             "in {}, out {}, experts {})", what, rows, in, out, E);
}

void report(cudaError_t err, const char* what, Path p, int64_t E, int64_t rows, int64_t in, int64_t out) {
  TREX_CHECK(err == cudaSuccess, "{} ({}): {} (experts {}, rows {}, in {}, out {})", what, path_name(p),
             cudaGetErrorString(err), E, rows, in, out);
}

// fwd (F = Fwd: y = x W_e^T, n = out, k = in) and dx (y = dy W_e, n = in, k = out).
template <sm90::Form F>
void run_rows(const char* what, Path path, bf16* y, const bf16* x, const bf16* W, const int32_t* offsets,
              int64_t E, int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream) {
  check_dims(what, E, in, out);
  check_aligned(what, y, x, W);
  if (rows == 0) return;
  constexpr bool kFwd = F == sm90::Form::Fwd;
  const int64_t n = kFwd ? out : in, k = kFwd ? in : out;
  cudaError_t err;
  if (path == Path::Sm90) {
    check_sm90(what, rows, in, out, E);
    sm90::tile_prefix_kernel<<<1, sm90::kPrefixThreads, 0, stream>>>(offsets, int(E), sm90::kBM, scratch);
    TREX_CUDA_LAUNCHED();
    err = launch_sm90<F>(y, x, W, offsets, scratch, E, rows, in, out, stream);
  } else if (path == Path::MmaLarge) {
    err = mma_gg::launch_rows<CfgLarge, kFwd>(y, x, W, offsets, E, rows, n, k, scratch, stream);
  } else {
    err = mma_gg::launch_rows<CfgSmall, kFwd>(y, x, W, offsets, E, rows, n, k, scratch, stream);
  }
  report(err, what, path, E, rows, in, out);
}

}  // namespace

const char* path_name(Path p) {
  switch (p) {
    case Path::Sm90: return "sm90 wgmma 128x256, 4 stages, staged epilogue, dw by L2 reductions";
    case Path::MmaLarge: return "mma.sync 128x256x64";
    case Path::MmaSmall: return "mma.sync 128x128x32";
  }
  return "?";
}

bool sm90_device() {
  static const bool avail = sm90::available();
  return avail;
}

Path choose(Form form, bool sm90_dev, int64_t rows, int64_t in, int64_t out, int64_t n_groups) {
  if (sm90_dev && sm90_extents(rows, in, out, n_groups)) return Path::Sm90;
  const int64_t tiles = form == Form::Fwd  ? (rows / CfgLarge::kBM) * (out / CfgLarge::kBN)
                        : form == Form::Dx ? (rows / CfgLarge::kBM) * (in / CfgLarge::kBN)
                                           : n_groups * (out / CfgLarge::kBM) * (in / CfgLarge::kBN);
  return tiles >= kLargeTiles ? Path::MmaLarge : Path::MmaSmall;
}

void run_fwd(Path path, bf16* y, const bf16* x, const bf16* W, const int32_t* offsets, int64_t n_groups,
             int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream) {
  run_rows<sm90::Form::Fwd>("grouped_linear_fwd", path, y, x, W, offsets, n_groups, rows, in, out, scratch,
                            stream);
}

void run_dx(Path path, bf16* dx, const bf16* dy, const bf16* W, const int32_t* offsets, int64_t n_groups,
            int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream) {
  run_rows<sm90::Form::Dx>("grouped_linear_dx", path, dx, dy, W, offsets, n_groups, rows, in, out, scratch,
                           stream);
}

void run_dw(Path path, float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t n_groups,
            int64_t rows, int64_t in, int64_t out, cudaStream_t stream) {
  const char* what = "grouped_linear_dw";
  check_dims(what, n_groups, in, out);
  check_aligned(what, dW, dy, x);
  if (rows == 0) return;  // no expert has rows: every gradient stays as it is
  cudaError_t err;
  if (path == Path::Sm90) {
    check_sm90(what, rows, in, out, n_groups);
    err = launch_sm90<sm90::Form::Dw>(dW, dy, x, offsets, nullptr, n_groups, rows, in, out, stream);
  } else if (path == Path::MmaLarge) {
    err = mma_gg::launch_dw<CfgLarge>(dW, dy, x, offsets, n_groups, in, out, stream);
  } else {
    err = mma_gg::launch_dw<CfgSmall>(dW, dy, x, offsets, n_groups, in, out, stream);
  }
  report(err, what, path, n_groups, rows, in, out);
}

}  // namespace grouped_gemm

namespace gg = grouped_gemm;

int64_t grouped_linear_scratch(int64_t n_groups) { return n_groups + 1; }

void grouped_linear_fwd(bf16* y, const bf16* x, const bf16* W, const int32_t* offsets, int64_t n_groups,
                        int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream) {
  gg::run_fwd(gg::choose(gg::Form::Fwd, gg::sm90_device(), rows, in, out, n_groups), y, x, W, offsets, n_groups,
              rows, in, out, scratch, stream);
}

void grouped_linear_dx(bf16* dx, const bf16* dy, const bf16* W, const int32_t* offsets, int64_t n_groups,
                       int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream) {
  gg::run_dx(gg::choose(gg::Form::Dx, gg::sm90_device(), rows, in, out, n_groups), dx, dy, W, offsets, n_groups,
             rows, in, out, scratch, stream);
}

void grouped_linear_dw(float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t n_groups,
                       int64_t rows, int64_t in, int64_t out, cudaStream_t stream) {
  gg::run_dw(gg::choose(gg::Form::Dw, gg::sm90_device(), rows, in, out, n_groups), dW, dy, x, offsets, n_groups,
             rows, in, out, stream);
}

void grouped_linear_dw(float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t n_groups,
                       int64_t in, int64_t out, cudaStream_t stream) {
  gg::run_dw(gg::choose(gg::Form::Dw, gg::sm90_device(), gg::kRowsUnknown, in, out, n_groups), dW, dy, x, offsets,
             n_groups, gg::kRowsUnknown, in, out, stream);
}

}  // namespace trex::cuda
