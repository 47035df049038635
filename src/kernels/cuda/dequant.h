// De-quantisation of stored checkpoint tensors on the device (the GPU loader, model/cuda/checkpoint_stager.h): a
// window of a stored tensor, copied raw to the device, becomes fp32 with exactly the bits the host's conversions
// give (core/dtype.h; model/dsv4/checkpoint.h dequant_fp8_block / dequant_fp4_packed). Codes of 8 and 16 bits are
// decoded through tables built from the host's own conversion functions, so every code maps to the same value by
// construction; the scale is applied with one round-to-nearest fp32 multiply, as the host does.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace trex::cuda {

// How a stored element is encoded. F4_E2M1: two per byte, the low nibble the even element.
enum class StoredType : int32_t { F32, F64, F16, BF16, F8_E4M3, F8_E8M0, F4_E2M1 };

// The encoding of a checkpoint dtype, for the float dtypes whose elements decode one by one (F32, F64, F16, BF16,
// F8_E4M3, F8_E8M0). Packed FP4 is not one: its element type comes from the tensor's quantisation (the caller sets
// F4_E2M1). Any other dtype fails with an error naming `what` (integer tensors load on the host).
StoredType stored_type(DType t, std::string_view what);

// Device decode tables (floats): e4m3[256], e8m0[256], e2m1[16], f16[65536].
struct DecodeTables {
  const float* e4m3 = nullptr;
  const float* e8m0 = nullptr;
  const float* e2m1 = nullptr;
  const float* f16 = nullptr;
};
// The tables on the current device, built once per device from core/dtype.h's conversions (thread-safe; kept for
// the life of the process: 264 KB).
DecodeTables decode_tables();

// One window of a stored tensor viewed as [R, C]: rows [row0, row0 + rows) x columns [col0, col0 + cols), the
// data dense on the device (rows x cols elements, row-major; F4: cols even, cols / 2 bytes a row). With a scale,
// element (r, c) of the tensor is multiplied by scale block (r / block_rows, c / block_cols); `scale` holds the
// scale blocks [srow0, ...) x [scol0, scol0 + scale_ld) dense (scale_ld per row). FP8 128x128 blocks: block_rows =
// block_cols = 128; MXFP4: 1 x 32. Output: fp32 out[i * out_ld + j] for window element (i, j).
struct DequantWindow {
  StoredType type = StoredType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0, row0 = 0, col0 = 0;
  bool scaled = false;
  StoredType scale_type = StoredType::F8_E8M0;  // F8_E8M0, F32, BF16 or F16
  const void* scale = nullptr;
  int64_t scale_ld = 0, srow0 = 0, scol0 = 0, block_rows = 1, block_cols = 1;
  float* out = nullptr;
  int64_t out_ld = 0;
};
void dequant_window(const DequantWindow& w, const DecodeTables& t, cudaStream_t s = nullptr);

}  // namespace trex::cuda
