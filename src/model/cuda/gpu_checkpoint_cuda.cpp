// GpuModel::load_checkpoint: a rank's partition straight from the checkpoint files, tensor by tensor (no host copy
// of the model, no CPU model in between), so a rank of a partitioned run loads only what it holds. The stored
// bytes of the rank's rows / columns go through a bounded pinned staging buffer to the device and are de-quantised
// there (checkpoint_stager.h); only the router biases and hash tables (vectors and small integer tables) are
// decoded on the host.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "model/cuda/checkpoint_stager.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/grad_buckets.h"
#include "model/dsv4/checkpoint.h"

namespace trex::dsv4gpu {

namespace {

// The host tensor as fp32, checked against the expected shape.
const float* host_f32(const HostTensor& t, const std::string& name, const Shape& shape) {
  TREX_CHECK(t.shape() == shape, "GPU model load: checkpoint tensor '{}' has shape {}, the model expects {}", name,
             shape_str(t.shape()), shape_str(shape));
  TREX_CHECK(t.view.dtype == DType::F32, "GPU model load: checkpoint tensor '{}' is {}, expected a float tensor",
             name, dtype_name(t.view.dtype));
  return t.f32();
}

// The window of the official tensor's [R, C] view (checkpoint_stager.h) this TP rank holds: all of it, its rows
// (split along the first axis) or its columns (split along the last).
struct Window {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};
Window tp_window(const GpuParam& p, int tp_size, int tp_rank) {
  const Shape& s = p.full;
  int64_t R = 1;
  const int64_t C = s.empty() ? 1 : s.back();
  for (size_t i = 0; i + 1 < s.size(); ++i) R *= s[i];
  Window w{0, R, 0, C};
  if (p.tp_axis < 0 || tp_size == 1) return w;
  if (p.tp_axis == int(s.size()) - 1) {
    w.c0 = C / tp_size * tp_rank, w.c1 = w.c0 + C / tp_size;
  } else if (p.tp_axis == 0) {
    w.r0 = R / tp_size * tp_rank, w.r1 = w.r0 + R / tp_size;
  } else {
    fail("GPU model load: '{}' {} is split over TP along axis {}: only the first or last axis load in slices", p.name,
         shape_str(s), p.tp_axis);
  }
  return w;
}

}  // namespace

GpuModel::LoadStats GpuModel::load_checkpoint(const dsv4::CheckpointReader& ckpt, size_t staging_bytes) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  LoadStats st;
  // Every tensor is checked before anything is read, so a wrong checkpoint fails at once, naming the tensor.
  int64_t largest = 0;
  for (const GpuParam& p : m.params) {
    TREX_CHECK(ckpt.has(p.name), "GPU model load: the checkpoint has no tensor '{}'", p.name);
    TREX_CHECK(ckpt.shape(p.name) == p.full,
               "GPU model load: checkpoint tensor '{}' has shape {}, the model expects {} (this rank's part: {})",
               p.name, shape_str(ckpt.shape(p.name)), shape_str(p.full), shape_str(p.shape));
    largest = std::max(largest, p.numel);
  }
  // An all-gather of updated bf16 slices still in flight would overwrite the load.
  if (m.gbuckets) m.gbuckets->wait_gathers();
  {
    CheckpointStager stager(ckpt, staging_bytes);
    DevMem local(size_t(std::max<int64_t>(largest, 1)) * sizeof(float));  // one tensor's slice, fp32
    for (const GpuParam& p : m.params) {
      const Window w = tp_window(p, m.tp_size, m.tp_rank);
      TREX_CHECK((w.r1 - w.r0) * (w.c1 - w.c0) == p.numel, "GPU model load: '{}': TP window of {} elements, rank holds {}",
                 p.name, (w.r1 - w.r0) * (w.c1 - w.c0), p.numel);
      stager.read(p.name, w.r0, w.r1, w.c0, w.c1, local.as<float>(), w.c1 - w.c0);
      m.place_local(p, local.as<float>(), m.master.as<float>(), true);
      ++st.tensors;
      st.bytes += p.numel * int64_t(sizeof(float));
    }
    stager.finish();
    st.stored_bytes = stager.stored_bytes();
    st.host_peak_bytes = int64_t(stager.host_bytes());
  }
  int64_t host_tensor = 0;  // the largest host-decoded tensor (with its int32 copy for a hash table)
  for (auto& [name, dev] : m.bias) {
    TREX_CHECK(ckpt.has(name), "GPU model load: the checkpoint has no router bias '{}'", name);
    const HostTensor t = ckpt.load(name);
    const float* src = host_f32(t, name, Shape{m.cfg.n_routed_experts});
    TREX_CUDA(cudaMemcpy(dev.as<float>(), src, size_t(t.numel()) * sizeof(float), cudaMemcpyHostToDevice));
    host_tensor = std::max(host_tensor, int64_t(t.view.nbytes()));
    st.stored_bytes += int64_t(ckpt.files().entry(ckpt.source(name).stored).nbytes());
    ++st.tensors;
  }
  for (auto& [name, dev] : m.tid2eid) {
    TREX_CHECK(ckpt.has(name), "GPU model load: the checkpoint has no hash table '{}'", name);
    const HostTensor t = ckpt.load(name);
    TREX_CHECK(t.shape() == (Shape{m.cfg.vocab_size, m.cfg.topk}),
               "GPU model load: '{}' has shape {}, expected [{}, {}]", name, shape_str(t.shape()), m.cfg.vocab_size,
               m.cfg.topk);
    std::vector<int32_t> table(size_t(t.numel()));
    for (size_t i = 0; i < table.size(); ++i) {
      int64_t v = 0;
      if (t.view.dtype == DType::I64)
        v = t.view.as<int64_t>()[i];
      else if (t.view.dtype == DType::I32)
        v = t.view.as<int32_t>()[i];
      else
        fail("GPU model load: '{}' must be I64 or I32, got {}", name, dtype_name(t.view.dtype));
      TREX_CHECK(v >= 0 && v < m.cfg.n_routed_experts, "GPU model load: '{}' entry {} = {} is not an expert id",
                 name, i, v);
      table[i] = int32_t(v);
    }
    TREX_CUDA(cudaMemcpy(dev.as<int32_t>(), table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    host_tensor = std::max(host_tensor, int64_t(t.view.nbytes() + table.size() * sizeof(int32_t)));
    st.stored_bytes += int64_t(ckpt.files().entry(ckpt.source(name).stored).nbytes());
    ++st.tensors;
  }
  TREX_CUDA(cudaDeviceSynchronize());
  // The staging buffer is freed before the small host tensors are decoded; the high-water mark is the larger.
  st.host_peak_bytes = std::max(st.host_peak_bytes, host_tensor);
  st.largest_tensor_bytes = largest * int64_t(sizeof(float));
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace trex::dsv4gpu
