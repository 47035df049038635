// What the pipeline executor (pipeline_executor.h) needs from a backend: where boundary tensors live (host
// vectors for the CPU model over MPI, device buffers for the CUDA model over NCCL), how wide their elements are
// on the wire, and how compute is ordered after communication. The executor itself (schedule walking, receive
// posting, send tracking, in-flight bookkeeping, wait / bubble statistics) is the same for both.
//
// Buffers are asked for by role, so each backend keeps its own reuse policy: the host pools buffers that live
// until the micro-batch's backward (stages may keep pointers to their inputs); the device alternates two receive
// buffers per direction (its stages copy what they keep into their own slots) and sends from the stages' slots.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace trex::parallel {

enum class BoundaryRole {
  ActIn,   // an activation received from the previous stage (forward input)
  ActOut,  // an activation this stage sends on (forward output), when the stage does not own it
  GradIn,  // the gradient of this stage's output, received from the next stage (backward input)
  GradOut, // the gradient of this stage's input, sent back (backward output), when the stage does not own it
};

class PipelineMemory {
 public:
  virtual ~PipelineMemory() = default;
  // Bytes of one element of the activations / of their gradients crossing a stage boundary.
  virtual size_t act_elem_bytes() const = 0;
  virtual size_t grad_elem_bytes() const = 0;
  // The boundary changed to `elems` elements: no tensor is in flight (between steps); drop or resize buffers.
  virtual void resize(int64_t elems) = 0;
  // A buffer of the current boundary size for `role`; the executor gives it back when nothing reads it any more
  // (after the consuming backward for inputs, once the send completed for outputs).
  virtual void* take(BoundaryRole role) = 0;
  virtual void give(BoundaryRole role, void* buf) = 0;
  // A receive the host saw complete: the compute that reads its buffer is ordered after it (host memory:
  // nothing to do; device memory: the compute stream waits for the transfer).
  virtual void after_receive(comm::Work& w) = 0;
  // A send still reading a buffer the stage owns, which the next compute rewrites or frees: order that compute
  // after it (host: wait; device: the compute stream waits, the host goes on).
  virtual void before_reuse(comm::Work& w) = 0;
  // Around every forward / backward (global stage `stage`): a backend timing on the device records it here.
  virtual void compute_begin(int stage, bool backward) { (void)stage, (void)backward; }
  virtual void compute_end(int stage, bool backward) { (void)stage, (void)backward; }
};

// Host memory: fp32 boundary tensors in std::vector buffers, pooled across micro-batches and steps.
class HostPipelineMemory final : public PipelineMemory {
 public:
  size_t act_elem_bytes() const override { return sizeof(float); }
  size_t grad_elem_bytes() const override { return sizeof(float); }
  void resize(int64_t elems) override;
  void* take(BoundaryRole role) override;
  void give(BoundaryRole role, void* buf) override;
  void after_receive(comm::Work&) override {}
  void before_reuse(comm::Work& w) override { w.wait(); }

 private:
  int64_t elems_ = 0;
  std::vector<std::unique_ptr<float[]>> all_;  // every buffer of the current size
  std::vector<float*> free_;                   // those no tensor in flight uses
};

}  // namespace trex::parallel
