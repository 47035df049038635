// Which kernel a grouped expert GEMM call (grouped_gemm.h) runs, and each path as a plain call: the public
// functions are run_*(choose(...), ...), nothing else picks a path; the GPU test calls choose() for both kinds of
// device and run_*() on every path the current device can run, so each branch is checked against the reference
// on an H200 too. Not for model code: call grouped_gemm.h.
#pragma once
#include "kernels/cuda/grouped_gemm.h"

namespace trex::cuda::grouped_gemm {

enum class Form { Fwd, Dx, Dw };
// Sm90: the wgmma + TMA kernel, 128 x 256 tiles, 4 stages, epilogue staged through shared memory, dw added by
// L2 reductions. MmaSmall / MmaLarge: the mma.sync kernel with 128 x 128 x 32 tiles (two blocks per SM) or
// 128 x 256 x 64 (one block per SM; fewer shared-memory reads per mma, worth it from two waves of tiles on).
enum class Path { Sm90, MmaSmall, MmaLarge };
const char* path_name(Path p);

// rows of the dw overload that has no row count (the sm90 kernel's tensor maps need it).
constexpr int64_t kRowsUnknown = -1;
// Whether the current device runs the sm90 kernel (compute capability 9.0, the driver's tensor-map encoder);
// asked once per process.
bool sm90_device();
// The path for this call: Sm90 on an sm90 device when the row count is known and the extents fit its int32
// coordinates, else MmaLarge from 264 large tiles (two waves of 132 SMs), else MmaSmall.
Path choose(Form form, bool sm90_device, int64_t rows, int64_t in, int64_t out, int64_t n_groups);

// The products of grouped_gemm.h on a given path (argument checks included). Sm90 throws on a device or shape
// it cannot run, and for dw needs rows >= 0.
void run_fwd(Path path, bf16* y, const bf16* x, const bf16* W, const int32_t* offsets, int64_t n_groups,
             int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream);
void run_dx(Path path, bf16* dx, const bf16* dy, const bf16* W, const int32_t* offsets, int64_t n_groups,
            int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream);
void run_dw(Path path, float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t n_groups,
            int64_t rows, int64_t in, int64_t out, cudaStream_t stream);

}  // namespace trex::cuda::grouped_gemm
