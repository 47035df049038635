// GpuModel's state beyond the step (gpu_model.h): the gradient norm and scaling behind clipping, per-tensor
// writes of master weights (checkpoint resume), and the router biases (the auxiliary-loss-free update). One GPU:
// under data parallelism the masters are ZeRO-1 shards.
#include <fmt/format.h>

#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

namespace {
void check_one_gpu(const GpuModel::Impl& m, const char* what) {
  TREX_CHECK(m.dp_size == 1, "GPU model: {} needs the whole model on one GPU (data-parallel size {})", what,
             m.dp_size);
}
void check_size(const GpuParam& p, size_t n, const char* what) {
  TREX_CHECK(int64_t(n) == p.numel, "GPU model {}: '{}' has {} elements, got {}", what, p.name, p.numel, n);
}
}  // namespace

double GpuModel::grad_norm() {
  Impl& m = *impl_;
  check_one_gpu(m, "grad_norm");
  m.require_gradients("grad_norm()");
  if (m.tp_size > 1) return m.tp_grad_norm();
  DevMem scratch(size_t(cuda::kSumSquaresBlocks + 1) * sizeof(double));
  // The ranges counted: the whole arena, less a pipeline's tied embedding copy (the first stage counts it).
  std::vector<std::pair<int64_t, int64_t>> ranges{{0, m.total}};
  if (m.embed_copy()) {
    const GpuModel::Impl::Bucket& e = m.buckets[size_t(m.embed_bucket)];
    ranges = {{0, e.begin}, {e.end, m.total}};
  }
  double ss = 0;
  for (const auto& [a, e] : ranges) {
    if (e <= a) continue;
    cuda::sum_squares_f32(m.grads.as<float>() + a, e - a, scratch.as<double>());
    double part = 0;
    TREX_CUDA(cudaMemcpy(&part, scratch.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
    ss += part;
  }
  return std::sqrt(ss);
}

void GpuModel::scale_grads(float s) {
  Impl& m = *impl_;
  check_one_gpu(m, "scale_grads");
  m.require_gradients("scale_grads()");
  cuda::scale_f32(m.grads.as<float>(), s, m.total);  // grads_zero stays as it is: scaled zeros are zeros
}

void GpuModel::set_value(const std::string& name, const std::vector<float>& v) {
  Impl& m = *impl_;
  check_one_gpu(m, "set_value");
  const GpuParam& p = m.info(name);
  check_size(p, v.size(), "set_value");
  float* dst = m.master.as<float>() + p.offset;
  TREX_CUDA(cudaMemcpy(dst, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  cuda::cast_f32_to_bf16(m.compute.as<bf16>() + p.offset, dst, p.numel);
  TREX_CUDA(cudaDeviceSynchronize());
}

std::vector<std::string> GpuModel::router_bias_names() const {
  std::vector<std::string> n;
  for (const auto& [name, t] : impl_->bias) n.push_back(name);
  return n;
}

std::vector<float> GpuModel::router_bias(const std::string& name) const {
  const Impl& m = *impl_;
  auto it = m.bias.find(name);
  TREX_CHECK(it != m.bias.end(), "GPU model: no router bias '{}'", name);
  std::vector<float> v(size_t(m.cfg.n_routed_experts));
  TREX_CUDA(cudaMemcpy(v.data(), it->second.as<float>(), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

void GpuModel::set_router_bias(const std::string& name, const std::vector<float>& v) {
  Impl& m = *impl_;
  auto it = m.bias.find(name);
  TREX_CHECK(it != m.bias.end(), "GPU model: no router bias '{}'", name);
  TREX_CHECK(int64_t(v.size()) == m.cfg.n_routed_experts, "GPU model set_router_bias: '{}' has {} experts, got {}",
             name, m.cfg.n_routed_experts, v.size());
  TREX_CUDA(cudaMemcpy(it->second.as<float>(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
}

}  // namespace trex::dsv4gpu
