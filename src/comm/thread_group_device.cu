// Device side of the thread-group communicator (thread_group_device.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "comm/thread_group_device.h"

namespace trex::comm::tg {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("thread-group communicator: CUDA error ") + cudaGetErrorString(e) + " in " +
                             what);
}

struct Sources {
  const void* p[kMaxReduceRanks];
};

// ElemType / ReduceOp values (communicator.h): F32, F64, I32, I64, U8, BF16; Sum, Max, Min.
template <typename T>
struct Acc {
  using type = T;
  __device__ static type load(const void* p, size_t i) { return static_cast<const T*>(p)[i]; }
  __device__ static void store(void* p, size_t i, type v) { static_cast<T*>(p)[i] = v; }
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
  __device__ static float load(const void* p, size_t i) { return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]); }
  __device__ static void store(void* p, size_t i, float v) { static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); }
};

template <typename T, int OP>
__global__ void reduce_kernel(void* dst, Sources s, int n, size_t count) {
  using A = Acc<T>;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    typename A::type acc = A::load(s.p[0], i);
    for (int r = 1; r < n; ++r) {
      const typename A::type v = A::load(s.p[r], i);
      if (OP == 0) acc = acc + v;
      else if (OP == 1) acc = v > acc ? v : acc;
      else acc = v < acc ? v : acc;
    }
    A::store(dst, i, acc);
  }
}

template <typename T>
void launch(int op, void* dst, const Sources& s, int n, size_t count, cudaStream_t st) {
  const int threads = 256;
  const size_t want = (count + threads - 1) / threads;
  const int blocks = int(want < 4096 ? (want ? want : 1) : 4096);
  if (op == 0) reduce_kernel<T, 0><<<blocks, threads, 0, st>>>(dst, s, n, count);
  else if (op == 1) reduce_kernel<T, 1><<<blocks, threads, 0, st>>>(dst, s, n, count);
  else reduce_kernel<T, 2><<<blocks, threads, 0, st>>>(dst, s, n, count);
}

}  // namespace

bool is_device_pointer(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on older runtimes: clear the sticky-free error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

void* create_stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void destroy_stream(void* s) {
  cudaStreamSynchronize(static_cast<cudaStream_t>(s));
  cudaStreamDestroy(static_cast<cudaStream_t>(s));
}

void* record_event(void* stream) {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(e, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  return e;
}

void* record_default_stream_event() { return record_event(nullptr); }

void destroy_event(void* ev) {
  if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
}

bool event_done(void* ev) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery (an operation failed on the device)");
  return false;
}

void stream_wait_event(void* stream, void* ev) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(ev), 0),
        "cudaStreamWaitEvent");
}

void copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
}

void* alloc_device_zeroed(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  check(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}

void free_device(void* p) {
  if (p) cudaFree(p);
}

void reduce_async(void* dst, const void* const* src, int n, size_t count, int type, int op, void* stream) {
  if (count == 0) return;
  if (n < 1 || n > kMaxReduceRanks)
    throw std::runtime_error("thread-group communicator: a device reduction over " + std::to_string(n) +
                             " ranks (1.." + std::to_string(kMaxReduceRanks) + " supported)");
  Sources s{};
  for (int r = 0; r < n; ++r) s.p[r] = src[r];
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (type) {
    case 0: launch<float>(op, dst, s, n, count, st); break;
    case 1: launch<double>(op, dst, s, n, count, st); break;
    case 2: launch<int32_t>(op, dst, s, n, count, st); break;
    case 3: launch<int64_t>(op, dst, s, n, count, st); break;
    case 4: launch<uint8_t>(op, dst, s, n, count, st); break;
    case 5: launch<__nv_bfloat16>(op, dst, s, n, count, st); break;
    default: throw std::runtime_error("thread-group communicator: unknown element type " + std::to_string(type));
  }
  check(cudaGetLastError(), "the reduction kernel launch");
}

}  // namespace trex::comm::tg
