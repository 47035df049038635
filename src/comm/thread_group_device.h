// The device side of the thread-group communicator (thread_group.h): plain functions over opaque CUDA handles, so
// that thread_group.cpp compiles without CUDA. Implemented in thread_group_device.cu (CUDA builds); a CPU build
// classifies every pointer as host memory and never calls the rest. Errors throw std::runtime_error.
#pragma once
#include <cstddef>

namespace trex::comm::tg {

constexpr int kMaxReduceRanks = 64;  // sources of one reduction kernel (passed by value)

bool is_device_pointer(const void* p);
int current_device();
void* create_stream();                       // non-blocking
void destroy_stream(void* s);
void* record_default_stream_event();         // an event after the work queued so far on the legacy default stream
void* record_event(void* stream);
void destroy_event(void* ev);
bool event_done(void* ev);                   // throws if the device reported an error
void stream_wait_event(void* stream, void* ev);
void copy_async(void* dst, const void* src, size_t bytes, void* stream);
// Device memory of `bytes`, zeroed (the emulated group's loop-back buffers, emulated_group.h); free_device frees it.
void* alloc_device_zeroed(size_t bytes);
void free_device(void* p);
// dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i], left to right; dst may be one of the sources.
// type / op: the ElemType / ReduceOp enumerators' values.
void reduce_async(void* dst, const void* const* src, int n, size_t count, int type, int op, void* stream);

}  // namespace trex::comm::tg
