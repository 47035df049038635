#include "bench_train.h"
#include "model/dsv4/config.h"
#include "train/dsv4_trainable.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#ifdef TREX_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "model/dsv4/config.h"
#include "train/cuda/dsv4_gpu.h"
#endif

namespace trex::bench {

namespace {

constexpr double kH200Bf16Peak = 989.4e12;

}  // namespace

double model_flops_per_token(const std::string& path, int64_t seq) {
  // One formula for the project (model_flops.py's convention): the trainer's, on the parsed config.
  return trex::train::dsv4_flops_per_token(trex::dsv4::load_model_config(path), seq);
}

void bench_train(const TrainBenchArgs& a) {
#ifndef TREX_HAVE_CUDA
  (void)a;
  fail("bench train: this build has no CUDA backend (configure with -DTREX_CUDA=ON)");
#else
  TREX_CHECK(a.seq > 0 && a.batch > 0 && a.steps > 0 && a.warmup >= 0, "bench train: seq {}, batch {}, steps {}, "
             "warmup {} must be positive", a.seq, a.batch, a.steps, a.warmup);
  const dsv4::ModelConfig cfg = dsv4::load_model_config(a.config);
  const double flops_tok = model_flops_per_token(a.config, a.seq);
  dsv4gpu::GpuModelOptions mo;
  mo.timing = a.sections;
  dsv4gpu::GpuModel model(cfg, mo);
  model.init_random(a.seed);
  const int64_t N = a.seq * a.batch;
  std::mt19937_64 g(a.seed + 1);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& t : ids) t = int32_t(g() % uint64_t(cfg.vocab_size));
  const std::vector<int32_t> labels = ids;  // as the baseline: labels = input ids, shifted inside the loss
  const dsv4::SeqLayout layout = dsv4::SeqLayout::unpacked(a.batch, a.seq);
  cuda::AdamWStep opt;
  opt.lr = 1e-5, opt.eps = 1e-8, opt.weight_decay = 0.01;  // the baseline: torch AdamW defaults, lr 1e-5
  int64_t step = 0;
  double first_loss = 0, last_loss = 0;
  auto train_step = [&] {
    const double loss = model.forward(ids.data(), labels.data(), layout);
    model.zero_grads();
    model.backward();
    opt.step = ++step;
    model.adamw_step(opt);
    return loss;
  };
  for (int i = 0; i < a.warmup; ++i) first_loss = train_step();
  TREX_CUDA(cudaDeviceSynchronize());
  cudaMemPool_t pool;
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t zero = 0;
  TREX_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  model.reset_sections();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) {
    last_loss = train_step();
    if (step == 1) first_loss = last_loss;
  }
  TREX_CUDA(cudaDeviceSynchronize());
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  uint64_t used_high = 0;
  TREX_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const double tok_s = double(N) / dt;
  const double tflops = tok_s * flops_tok / 1e12;
  nlohmann::json j;
  j["system"] = "trex-cuda";
  j["config"] = std::filesystem::path(a.config).filename().string();
  j["seq"] = a.seq;
  j["batch"] = a.batch;
  j["params"] = model.n_params();
  j["step_s"] = std::round(dt * 1e4) / 1e4;
  j["tokens_per_s"] = std::llround(tok_s);
  j["model_tflops"] = std::round(tflops * 10) / 10;
  j["mfu"] = std::round(tflops * 1e12 / kH200Bf16Peak * 1e4) / 1e4;
  j["peak_gib"] = std::round(double(used_high) / double(1ull << 30) * 10) / 10;  // stream-ordered pool high-water
  j["device_used_gib"] = std::round(double(total_b - free_b) / double(1ull << 30) * 10) / 10;
  j["gflop_per_token"] = std::round(flops_tok / 1e6) / 1e3;
  j["loss_first"] = first_loss;
  j["loss_last"] = last_loss;
  j["warmup"] = a.warmup;
  j["steps"] = a.steps;
  if (a.sections) {
    nlohmann::json s;
    for (const auto& [name, ms] : model.section_ms()) s[name] = std::round(ms / a.steps * 100) / 100;
    j["section_ms_per_step"] = s;
  }
  std::printf("%s\n", j.dump().c_str());
#endif
}

}  // namespace trex::bench
