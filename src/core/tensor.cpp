#include "core/tensor.h"

#include <cstring>

namespace trex {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Buffer::Buffer(size_t bytes, bool zero) : size_(bytes) {
  size_t rounded = (bytes + 63) & ~size_t(63);
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  TREX_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  if (zero) std::memset(p, 0, rounded);
  ptr_.reset(p);
}

HostTensor::HostTensor(DType dtype, Shape shape) {
  view.dtype = dtype;
  view.shape = std::move(shape);
  storage = Buffer(view.nbytes());
  view.data = storage.data();
}

}  // namespace trex
