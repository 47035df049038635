// The device decode tables of dequant.h, from the host's conversion functions (core/dtype.h), and the map from
// checkpoint dtypes to stored encodings.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant.h"

namespace trex::cuda {

StoredType stored_type(DType t, std::string_view what) {
  switch (t) {
    case DType::F32:
      return StoredType::F32;
    case DType::F64:
      return StoredType::F64;
    case DType::F16:
      return StoredType::F16;
    case DType::BF16:
      return StoredType::BF16;
    case DType::F8_E4M3:
      return StoredType::F8_E4M3;
    case DType::F8_E8M0:
      return StoredType::F8_E8M0;
    default:
      fail("{}: dtype {} cannot be de-quantised on the GPU (integer tensors load on the host)", what, dtype_name(t));
  }
}

DecodeTables decode_tables() {
  static std::mutex mu;
  static std::map<int, DecodeTables> per_device;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = per_device.find(dev);
  if (it != per_device.end()) return it->second;
  std::vector<float> h(256 + 256 + 16 + 65536);
  for (int c = 0; c < 256; ++c) h[size_t(c)] = fp8_e4m3_to_f32(uint8_t(c));
  for (int c = 0; c < 256; ++c) h[size_t(256 + c)] = e8m0_to_f32(uint8_t(c));
  for (int c = 0; c < 16; ++c) h[size_t(512 + c)] = fp4_e2m1_to_f32(uint8_t(c));
  for (int c = 0; c < 65536; ++c) h[size_t(528 + c)] = f16_to_f32(uint16_t(c));
  float* d = nullptr;  // never freed: the tables live as long as the process uses the device
  TREX_CUDA(cudaMalloc(&d, h.size() * sizeof(float)));
  TREX_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  DecodeTables t{d, d + 256, d + 512, d + 528};
  per_device.emplace(dev, t);
  return t;
}

}  // namespace trex::cuda
