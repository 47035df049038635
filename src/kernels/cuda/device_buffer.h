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
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) {
      TREX_CUDA(cudaMallocAsync(&ptr_, bytes, nullptr));
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
