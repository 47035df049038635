// One pipeline stage (or one virtual stage of an interleaved schedule) as the schedule executor sees it.
// The stage owns its parameters and the activations of every micro-batch in flight; the executor only moves
// the boundary tensors (the residual stream leaving a stage and its gradient coming back) between ranks and
// decides the order of forward and backward passes (1F1B, interleaved).
//
// Boundary tensors are in the backend's memory (pipeline_memory.h): fp32 host arrays for the CPU model, device
// buffers for the CUDA model (bf16 activations, fp32 gradients), hence the untyped pointers.
//
// Micro-batch data (token ids, labels, document layout) is given to every stage before the step by the
// trainer, so stages that need token ids (hash-routed MoE layers, the MTP module) have them wherever they are.
#pragma once
#include <cstdint>

namespace trex::parallel {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Elements of the tensor sent to the next stage (and of its gradient), the same for every micro-batch.
  virtual int64_t boundary_elems() const = 0;
  virtual bool is_first() const = 0;  // reads tokens itself; x_in / dx_in are null
  virtual bool is_last() const = 0;   // computes the loss; x_out / dx_out are null
  // Forward of micro-batch m (0-based within the step). Keeps what its backward needs until backward(m).
  // Returns the loss contribution of this stage for m (the last stage's LM/MTP loss; any stage may add
  // auxiliary terms such as its layers' balance loss), already multiplied by the step's loss scale.
  // x_out is null when the stage owns its outputs (owned_slots() > 0): then output(m) is what is sent.
  virtual double forward(int64_t m, const void* x_in, void* x_out) = 0;
  // Backward of micro-batch m: accumulates parameter gradients, writes dx_in (or, owning its outputs, the
  // buffer input_grad(m) returns), frees m's activations.
  virtual void backward(int64_t m, const void* dx_out, void* dx_in) = 0;

  // Stages that keep their boundary outputs in their own activation slots (micro-batch m in slot m % slots,
  // rewritten by the slot's next forward / backward) return the slot count; the executor then sends straight
  // from output(m) / input_grad(m) and orders each slot's next compute after the slot's last send. 0: the
  // executor hands the stage an output buffer of the backend's memory per micro-batch.
  virtual int owned_slots() const { return 0; }
  virtual const void* output(int64_t m) const { (void)m; return nullptr; }
  virtual const void* input_grad(int64_t m) const { (void)m; return nullptr; }
};

}  // namespace trex::parallel
