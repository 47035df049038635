// Non-owning tensor views over arenas or mapped files, plus an owning aligned buffer.
// Model code works on raw pointers (llm.c style); views carry dtype and shape where a file or an
// API boundary needs them.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace trex {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}
std::string shape_str(const Shape& s);  // "[2, 160, 64]"

struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  void* data = nullptr;

  int64_t numel() const { return trex::numel(shape); }
  size_t nbytes() const { return dtype_bytes(dtype, size_t(numel())); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  float* f32() const {
    TREX_ASSERT(dtype == DType::F32);
    return static_cast<float*>(data);
  }
};

// 64-byte aligned owning storage.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes, bool zero = true);
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  void* data() const { return ptr_.get(); }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_.get()); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
  size_t size_ = 0;
};

// An owning fp32 (or other dtype) tensor: a Buffer plus its view.
struct HostTensor {
  Buffer storage;
  TensorView view;
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);
  static HostTensor zeros_f32(Shape shape) { return HostTensor(DType::F32, std::move(shape)); }
  float* f32() const { return view.f32(); }
  int64_t numel() const { return view.numel(); }
  const Shape& shape() const { return view.shape; }
};

// Bump allocator over one aligned block, sized up front from a table of requests (llm.c's
// parameter/activation arenas). Allocation past the end is an internal error, never a realloc.
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t bytes) : buf_(bytes) {}
  void reset(size_t bytes) {
    buf_ = Buffer(bytes);
    used_ = 0;
  }
  template <typename T = float>
  T* alloc(size_t count) {
    size_t bytes = (count * sizeof(T) + 63) & ~size_t(63);
    TREX_CHECK(used_ + bytes <= buf_.size(), "arena overflow: need {} more bytes, {} of {} used", bytes,
               used_, buf_.size());
    T* p = reinterpret_cast<T*>(static_cast<char*>(buf_.data()) + used_);
    used_ += bytes;
    return p;
  }
  void clear() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return buf_.size(); }
  static size_t aligned(size_t bytes) { return (bytes + 63) & ~size_t(63); }

 private:
  Buffer buf_;
  size_t used_ = 0;
};

}  // namespace trex
