// Parameter table of the GPU model: the CPU model's official names and shapes (attention via
// dsv4::attention_param_specs), laid out so that each expert's w1 and w3 are adjacent ([2f, d], one GEMM gives
// gate|up) and the shared expert's w1|w3 likewise; random init on the device or a copy of the CPU table.
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/tensor_ops.h"
#include "train/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

void GpuModel::Impl::declare(const std::string& name, const Shape& shape) {
  TREX_CHECK(!index.count(name), "GPU model: parameter '{}' declared twice", name);
  GpuParam p;
  p.name = name;
  p.shape = shape;
  p.numel = numel(shape);
  p.offset = total;
  total += p.numel;  // no padding: fused expert / shared weights must be adjacent (8-element alignment checked)
  TREX_CHECK(p.offset % 8 == 0, "GPU model: parameter '{}' starts at element {} (not 16-byte aligned for bf16)",
             name, p.offset);
  index[name] = params.size();
  params.push_back(p);
}

const GpuParam& GpuModel::Impl::info(const std::string& name) const {
  auto it = index.find(name);
  TREX_CHECK(it != index.end(), "GPU model: no parameter '{}'", name);
  return params[it->second];
}

void GpuModel::Impl::declare_all() {
  const int64_t d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size, E = cfg.n_routed_experts, f = cfg.moe_inter;
  const int64_t mix = (2 + hc) * hc, fs = f * cfg.n_shared_experts;
  declare("embed.weight", {V, d});
  declare("head.weight", {V, d});
  declare("norm.weight", {d});
  declare("hc_head_fn", {hc, hc * d});
  // Small tensors (4, 1, 3 elements) go last so every large tensor stays 16-byte aligned.
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    declare(p + "attn_norm.weight", {d});
    declare(p + "ffn_norm.weight", {d});
    declare(p + "hc_attn_fn", {mix, hc * d});
    declare(p + "hc_ffn_fn", {mix, hc * d});
    for (const auto& s : dsv4::attention_param_specs(cfg, l))
      if (s.name != "attn.attn_sink") declare(p + s.name, s.shape);
    declare(p + "ffn.gate.weight", {E, d});
    if (fs > 0) {
      declare(p + "ffn.shared_experts.w1.weight", {fs, d});
      declare(p + "ffn.shared_experts.w3.weight", {fs, d});
      declare(p + "ffn.shared_experts.w2.weight", {d, fs});
    }
    for (int64_t e = 0; e < E; ++e) {
      declare(fmt::format("{}ffn.experts.{}.w1.weight", p, e), {f, d});
      declare(fmt::format("{}ffn.experts.{}.w3.weight", p, e), {f, d});
    }
    for (int64_t e = 0; e < E; ++e) declare(fmt::format("{}ffn.experts.{}.w2.weight", p, e), {d, f});
  }
  auto small = [&](const std::string& name, const Shape& shape) {
    GpuParam p;
    p.name = name, p.shape = shape, p.numel = numel(shape), p.offset = total;
    total += (p.numel + 7) / 8 * 8;
    index[name] = params.size();
    params.push_back(p);
  };
  small("hc_head_base", {hc});
  small("hc_head_scale", {1});
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    small(p + "attn.attn_sink", {cfg.n_heads});
    for (const char* site : {"attn", "ffn"}) {
      small(fmt::format("{}hc_{}_base", p, site), {mix});
      small(fmt::format("{}hc_{}_scale", p, site), {3});
    }
  }
}

void GpuModel::Impl::bind_all() {
  const int64_t d = cfg.hidden, E = cfg.n_routed_experts, f = cfg.moe_inter, K = cfg.topk;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    auto b = std::make_unique<GpuBlock>();
    b->layer = l;
    b->prefix = fmt::format("layers.{}.", l);
    b->dims = dsv4::AttentionDims::from_config(cfg, l);
    b->hash = cfg.mlp_types[size_t(l)] == dsv4::MlpType::HashMoE;
    const std::string& p = b->prefix;
    auto B = [&](const std::string& n) { return b16(p + n); };
    auto F = [&](const std::string& n) { return f32(p + n); };
    auto G = [&](const std::string& n) { return g32(p + n); };
    AttnW& a = b->aw;
    a.wq_a = B("attn.wq_a.weight"), a.q_norm = B("attn.q_norm.weight"), a.wq_b = B("attn.wq_b.weight");
    a.wkv = B("attn.wkv.weight"), a.kv_norm = B("attn.kv_norm.weight"), a.wo_a = B("attn.wo_a.weight");
    a.wo_b = B("attn.wo_b.weight"), a.sink = F("attn.attn_sink");
    a.g_wq_a = G("attn.wq_a.weight"), a.g_q_norm = G("attn.q_norm.weight"), a.g_wq_b = G("attn.wq_b.weight");
    a.g_wkv = G("attn.wkv.weight"), a.g_kv_norm = G("attn.kv_norm.weight"), a.g_wo_a = G("attn.wo_a.weight");
    a.g_wo_b = G("attn.wo_b.weight"), a.g_sink = G("attn.attn_sink");
    if (b->dims.type != dsv4::AttnType::Sliding) {
      a.cmp_wkv = B("attn.compressor.wkv.weight"), a.cmp_wgate = B("attn.compressor.wgate.weight");
      a.cmp_norm = B("attn.compressor.norm.weight"), a.cmp_ape = F("attn.compressor.ape");
      a.g_cmp_wkv = G("attn.compressor.wkv.weight"), a.g_cmp_wgate = G("attn.compressor.wgate.weight");
      a.g_cmp_norm = G("attn.compressor.norm.weight"), a.g_cmp_ape = G("attn.compressor.ape");
    }
    if (b->dims.type == dsv4::AttnType::CSA) {
      a.idx_wq_b = B("attn.indexer.wq_b.weight"), a.idx_wp = B("attn.indexer.weights_proj.weight");
      a.idx_wkv = B("attn.indexer.compressor.wkv.weight"), a.idx_wgate = B("attn.indexer.compressor.wgate.weight");
      a.idx_norm = B("attn.indexer.compressor.norm.weight"), a.idx_ape = F("attn.indexer.compressor.ape");
    }
    MoeW& m = b->mw;
    m.gate = B("ffn.gate.weight"), m.g_gate = G("ffn.gate.weight");
    const std::string e0 = "ffn.experts.0.";
    m.w13 = B(e0 + "w1.weight"), m.g_w13 = G(e0 + "w1.weight");
    m.w2 = B(e0 + "w2.weight"), m.g_w2 = G(e0 + "w2.weight");
    for (int64_t e = 0; e < E; ++e) {
      TREX_CHECK(info(p + fmt::format("ffn.experts.{}.w1.weight", e)).offset == info(p + e0 + "w1.weight").offset + e * 2 * f * d &&
                     info(p + fmt::format("ffn.experts.{}.w2.weight", e)).offset == info(p + e0 + "w2.weight").offset + e * d * f,
                 "GPU model: expert weights of {} are not laid out contiguously", p);
    }
    if (cfg.n_shared_experts > 0) {
      m.sw13 = B("ffn.shared_experts.w1.weight"), m.g_sw13 = G("ffn.shared_experts.w1.weight");
      m.sw2 = B("ffn.shared_experts.w2.weight"), m.g_sw2 = G("ffn.shared_experts.w2.weight");
    }
    if (b->hash) {
      DevMem& t = tid2eid[p + "ffn.gate.tid2eid"];
      t = DevMem(size_t(cfg.vocab_size * K) * sizeof(int32_t));
      TREX_CUDA(cudaMemsetAsync(t.as<int32_t>(), 0, size_t(cfg.vocab_size * K) * sizeof(int32_t), nullptr));
      m.tid2eid = t.as<int32_t>();
    } else {
      DevMem& t = bias[p + "ffn.gate.bias"];
      t = DevMem(size_t(E) * sizeof(float));
      TREX_CUDA(cudaMemsetAsync(t.as<float>(), 0, size_t(E) * sizeof(float), nullptr));
      m.bias = t.as<float>();
    }
    b->hc_attn_fn = F("hc_attn_fn"), b->hc_attn_base = F("hc_attn_base"), b->hc_attn_scale = F("hc_attn_scale");
    b->hc_ffn_fn = F("hc_ffn_fn"), b->hc_ffn_base = F("hc_ffn_base"), b->hc_ffn_scale = F("hc_ffn_scale");
    b->g_hc_attn_fn = G("hc_attn_fn"), b->g_hc_attn_base = G("hc_attn_base"), b->g_hc_attn_scale = G("hc_attn_scale");
    b->g_hc_ffn_fn = G("hc_ffn_fn"), b->g_hc_ffn_base = G("hc_ffn_base"), b->g_hc_ffn_scale = G("hc_ffn_scale");
    b->attn_norm = B("attn_norm.weight"), b->ffn_norm = B("ffn_norm.weight");
    b->g_attn_norm = G("attn_norm.weight"), b->g_ffn_norm = G("ffn_norm.weight");
    blocks.push_back(std::move(b));
  }
}

void GpuModel::Impl::refresh_compute() { cuda::cast_f32_to_bf16(compute.as<bf16>(), master.as<float>(), total); }

// Weights: uniform with the std of N(0, 1/fan_in) (the last dim is the input width); RMSNorm weights 1; sinks 0;
// mHC / hc_head mixing weights small so the Sinkhorn inputs stay moderate; ape small.
void GpuModel::init_random(uint64_t seed) {
  Impl& m = *impl_;
  uint64_t k = 0;
  for (const GpuParam& p : m.params) {
    float* w = m.master.as<float>() + p.offset;
    const std::string& n = p.name;
    const bool is_norm = n.find("norm.weight") != std::string::npos;
    if (is_norm) {
      std::vector<float> ones(size_t(p.numel), 1.f);
      TREX_CUDA(cudaMemcpy(w, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
      continue;
    }
    const bool tiny = n.find("hc_") != std::string::npos || n.find("attn_sink") != std::string::npos ||
                      n.find(".ape") != std::string::npos;
    const double fan_in = double(p.shape.back());
    const float scale = tiny ? 0.01f : float(std::sqrt(3.0 / fan_in));
    cuda::fill_uniform_f32(w, p.numel, seed * 1000003ull + (++k), scale);
  }
  std::mt19937_64 g(seed);
  const int64_t E = m.cfg.n_routed_experts, K = m.cfg.topk, V = m.cfg.vocab_size;
  for (auto& [name, t] : m.tid2eid) {
    std::vector<int32_t> table(size_t(V * K));
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
      for (int64_t j = 0; j < K; ++j) {  // K distinct experts per token
        const int64_t r = j + int64_t(g() % uint64_t(E - j));
        std::swap(perm[size_t(j)], perm[size_t(r)]);
        table[size_t(v * K + j)] = perm[size_t(j)];
      }
    }
    TREX_CUDA(cudaMemcpy(t.as<int32_t>(), table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  m.refresh_compute();
  TREX_CUDA(cudaDeviceSynchronize());
}

void GpuModel::load_from(const dsv4::ParamTable<float>& cpu) {
  Impl& m = *impl_;
  std::vector<float> host(size_t(m.total), 0.f);
  for (const GpuParam& p : m.params) {
    TREX_CHECK(cpu.has(p.name), "GPU model load: the CPU table has no '{}'", p.name);
    const dsv4::ParamInfo& ci = cpu.info(p.name);
    TREX_CHECK(ci.shape == p.shape, "GPU model load: '{}' is {} on the CPU, {} here", p.name, shape_str(ci.shape),
               shape_str(p.shape));
    const float* src = cpu.arena_value(ci);
    std::copy(src, src + p.numel, host.begin() + p.offset);
  }
  TREX_CUDA(cudaMemcpy(m.master.as<float>(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  for (auto& [name, t] : m.bias) {
    auto it = cpu.bias.find(name);
    TREX_CHECK(it != cpu.bias.end(), "GPU model load: no router bias '{}'", name);
    TREX_CUDA(cudaMemcpy(t.as<float>(), it->second.data(), it->second.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  for (auto& [name, t] : m.tid2eid) {
    auto it = cpu.tid2eid.find(name);
    TREX_CHECK(it != cpu.tid2eid.end(), "GPU model load: no hash table '{}'", name);
    TREX_CUDA(cudaMemcpy(t.as<int32_t>(), it->second.data(), it->second.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice));
  }
  m.refresh_compute();
  TREX_CUDA(cudaDeviceSynchronize());
}

std::vector<float> GpuModel::value(const std::string& name) const {
  const GpuParam& p = impl_->info(name);
  std::vector<float> v(size_t(p.numel));
  TREX_CUDA(cudaMemcpy(v.data(), impl_->f32(name), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<float> GpuModel::grad(const std::string& name) const {
  const GpuParam& p = impl_->info(name);
  std::vector<float> v(size_t(p.numel));
  TREX_CUDA(cudaMemcpy(v.data(), impl_->g32(name), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<std::string> GpuModel::param_names() const {
  std::vector<std::string> n;
  for (const auto& p : impl_->params) n.push_back(p.name);
  return n;
}

int64_t GpuModel::n_params() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.numel;
  return n;
}

void GpuModel::zero_grads() {
  TREX_CUDA(cudaMemsetAsync(impl_->grads.as<float>(), 0, size_t(impl_->total) * sizeof(float), nullptr));
}

void GpuModel::adamw_step(const cuda::AdamWStep& a) {
  Impl& m = *impl_;
  m.section("optimizer", true);
  cuda::adamw_step(m.master.as<float>(), m.grads.as<float>(), m.adam_m.as<float>(), m.adam_v.as<float>(),
                   m.compute.as<bf16>(), m.total, a);
  m.section("optimizer", false);
}

}  // namespace trex::dsv4gpu
