// Device memory owned by RAII, the project's one device-buffer type, plus host<->device copies. Allocation is
// stream-ordered on the default stream (cudaMallocAsync from the device's default pool, never managed memory),
// and so is the free: a buffer dropped while kernels still read it stays valid until they finish, and the pool
// hands the memory to the next allocation without a device synchronisation (the GPU model allocates its
// activations' fallback this way; its planned activations live in one arena, activation_arena.h).
// allocations(): how many device allocations DeviceBuffer has made in this process (all threads): the GPU tests
// assert that a step after the first makes none.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

// A device allocation the stream-ordered pool could not serve (cudaErrorMemoryAllocation): the bytes asked and what
// for, so a caller can say where the memory went (`trex bench train --emulate-rank` prints the pool by category).
// The CUDA error is cleared before the throw (a later launch check does not see it again).
class DeviceOutOfMemory : public Error {
 public:
  DeviceOutOfMemory(size_t bytes, std::string what, const std::string& message)
      : Error(message), bytes_(bytes), what_(std::move(what)) {}
  size_t bytes() const { return bytes_; }
  const std::string& purpose() const { return what_; }

 private:
  size_t bytes_;
  std::string what_;
};

// cudaMallocAsync on stream s that throws DeviceOutOfMemory when the device is full (other errors: TREX_CUDA's).
inline void* device_malloc_async(size_t bytes, cudaStream_t s, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, bytes, s);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    throw DeviceOutOfMemory(bytes, what,
                            fmt::format("out of device memory: {} of {} bytes ({:.3f} GiB) failed with {:.3f} GiB of "
                                        "{:.3f} GiB free on the device",
                                        what, bytes, double(bytes) / double(1ull << 30),
                                        double(free_b) / double(1ull << 30), double(total_b) / double(1ull << 30)));
  }
  if (err != cudaSuccess)
    fail("CUDA error {} ({}) in cudaMallocAsync of {} bytes ({})", int(err), cudaGetErrorString(err), bytes, what);
  return p;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) {
      ptr_ = device_malloc_async(bytes, nullptr, "a device buffer");
      counter().fetch_add(1, std::memory_order_relaxed);
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFreeAsync(ptr_, nullptr);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeAsync(ptr_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  static int64_t allocations() { return counter().load(std::memory_order_relaxed); }

  template <typename T>
  static DeviceBuffer from_host(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    TREX_CUDA(cudaMemcpy(b.ptr_, v.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> v(bytes_ / sizeof(T));
    TREX_CUDA(cudaMemcpy(v.data(), ptr_, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  static std::atomic<int64_t>& counter() {
    static std::atomic<int64_t> n{0};
    return n;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace trex::cuda
