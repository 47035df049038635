// Stored checkpoint tensors streamed to the device through a bounded pinned staging buffer and de-quantised there
// (kernels/cuda/dequant.h): the raw FP8 / FP4 / BF16 / F32 bytes of a window of one tensor go from the memory-mapped
// safetensors (dsv4::CheckpointReader) into one half of the staging buffer while the other half's bytes are copied
// to the device and decoded, in chunks of at most half the buffer (rows, or columns of one row when a row is larger).
// Host memory: the staging buffer, whatever the tensor's size. The values are the bits CheckpointReader::load gives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace trex::dsv4 {
class CheckpointReader;
}

namespace trex::dsv4gpu {

class CheckpointStager {
 public:
  // staging_bytes: the pinned host buffer (and its device twin), split in two halves; at least 4 KB.
  CheckpointStager(const dsv4::CheckpointReader& ckpt, size_t staging_bytes);
  ~CheckpointStager();
  CheckpointStager(const CheckpointStager&) = delete;
  CheckpointStager& operator=(const CheckpointStager&) = delete;

  // The official tensor `name` viewed as [R, C] (C its last dimension, R the product of the others; a scalar is
  // [1, 1]): rows [r0, r1) x columns [c0, c1) de-quantised to fp32 into the device array out (out_ld floats a
  // row), queued on the default stream. Only those rows' bytes are read from the file (and only those columns').
  void read(const std::string& name, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out, int64_t out_ld);
  // [R, C] of read()'s view of `name`.
  static void view_2d(const std::string& name, const dsv4::CheckpointReader& ckpt, int64_t* R, int64_t* C);
  void finish();  // waits for everything queued
  int64_t stored_bytes() const;  // bytes read from the files so far (weights and scales)
  size_t host_bytes() const;     // the pinned staging buffer

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trex::dsv4gpu
