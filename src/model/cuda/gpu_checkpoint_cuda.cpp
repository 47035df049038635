// GpuModel::load_checkpoint: a rank's partition straight from the checkpoint files, tensor by tensor (no host copy
// of the model, no CPU model in between), so a rank of a partitioned run loads only what it holds.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "model/cuda/gpu_impl.h"
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

}  // namespace

GpuModel::LoadStats GpuModel::load_checkpoint(const dsv4::CheckpointReader& ckpt) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  LoadStats st;
  int64_t largest = 0;
  for (const GpuParam& p : m.params) {
    TREX_CHECK(ckpt.has(p.name), "GPU model load: the checkpoint has no tensor '{}'", p.name);
    const HostTensor t = ckpt.load(p.name);
    // The fp32 master pieces this rank holds and the bf16 compute copy (set_shard places them).
    // Under tensor parallelism the checkpoint's tensor is the official one; set_shard keeps this TP rank's slice.
    set_shard(p.name, host_f32(t, p.name, p.full), numel(p.full));
    largest = std::max(largest, numel(p.full));
    ++st.tensors;
    st.bytes += p.numel * int64_t(sizeof(float));
  }
  for (auto& [name, dev] : m.bias) {
    TREX_CHECK(ckpt.has(name), "GPU model load: the checkpoint has no router bias '{}'", name);
    const HostTensor t = ckpt.load(name);
    const float* src = host_f32(t, name, Shape{m.cfg.n_routed_experts});
    TREX_CUDA(cudaMemcpy(dev.as<float>(), src, size_t(t.numel()) * sizeof(float), cudaMemcpyHostToDevice));
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
    ++st.tensors;
  }
  TREX_CUDA(cudaDeviceSynchronize());
  st.largest_tensor_bytes = largest * int64_t(sizeof(float));
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace trex::dsv4gpu
