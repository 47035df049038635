#include "kernels/cuda/dequant.h"

#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float decode(StoredType t, const void* base, int64_t i, const DecodeTables& T) {
  switch (t) {
    case StoredType::F32:
      return static_cast<const float*>(base)[i];
    case StoredType::F64:
      return __double2float_rn(static_cast<const double*>(base)[i]);
    case StoredType::BF16:
      return __uint_as_float(uint32_t(static_cast<const uint16_t*>(base)[i]) << 16);
    case StoredType::F16:
      return T.f16[static_cast<const uint16_t*>(base)[i]];
    case StoredType::F8_E4M3:
      return T.e4m3[static_cast<const uint8_t*>(base)[i]];
    case StoredType::F8_E8M0:
      return T.e8m0[static_cast<const uint8_t*>(base)[i]];
    case StoredType::F4_E2M1: {
      const uint8_t b = static_cast<const uint8_t*>(base)[i >> 1];
      return T.e2m1[(b >> ((i & 1) * 4)) & 0xf];
    }
  }
  return __int_as_float(0x7fc00000);
}

__global__ void dequant_kernel(DequantWindow w, DecodeTables T) {
  const int64_t n = w.rows * w.cols;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / w.cols, j = k - i * w.cols;
    float v = decode(w.type, w.data, k, T);
    if (w.scaled) {
      const int64_t si = (w.row0 + i) / w.block_rows - w.srow0, sj = (w.col0 + j) / w.block_cols - w.scol0;
      v = __fmul_rn(v, decode(w.scale_type, w.scale, si * w.scale_ld + sj, T));
    }
    w.out[i * w.out_ld + j] = v;
  }
}

}  // namespace

void dequant_window(const DequantWindow& w, const DecodeTables& t, cudaStream_t s) {
  const int64_t n = w.rows * w.cols;
  if (n <= 0) return;
  const int64_t b = (n + kThreads - 1) / kThreads;
  dequant_kernel<<<unsigned(b < 65535 * 16 ? b : 65535 * 16), kThreads, 0, s>>>(w, t);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
