// The GPU mesh tests' shared setup (gpu_mesh_test_support.h).
#include "train/gpu_mesh_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/metrics.h"
#include "train/tiny_gpu_config.h"
#include "train/yaml.h"

namespace trex::testing {

namespace fs = std::filesystem;

std::vector<std::string> corpus_lines(const std::function<std::string(int)>& line, int n) {
  std::vector<std::string> t;
  for (int i = 0; i < n; ++i) t.push_back(line(i));
  return t;
}

dsv4::ModelConfig with_corpus_vocab(dsv4::ModelConfig c, const data::Tokenizer& tok) {
  c.vocab_size = std::max<int64_t>(c.vocab_size, (tok.vocab_size() + 63) / 64 * 64);
  return c;
}

train::Dsv4TrainOptions layout_train_options(bool deterministic) {
  train::Dsv4TrainOptions o;
  o.model.balance_alpha = 0.0;
  o.model.use_mtp = false;
  o.bias_update_speed = 1e-3;
  o.deterministic = deterministic;
  return o;
}

train::TrainConfig layout_run_config(const LayoutRunYaml& y, const std::string& parallel_line,
                                     const std::string& file) {
  const std::string text = "seed: " + std::to_string(y.seed) + "\nmodel: " + y.model +
                           "\ndata: {shards: x, tokenizer: y, seq_len: 64, batch_size: 2, grad_accum: " +
                           std::to_string(y.grad_accum) + "}\noptimizer: " + y.optimizer +
                           "\nschedule: {lr: 0.003, min_lr: 0.0003, warmup_steps: 2}\ntrain: {max_steps: 6}\n"
                           "checkpoint: " + y.checkpoint + "\nlogging: {plot: false}\n" + y.extra + parallel_line;
  return train::parse_train_config(train::parse_yaml(text, file), file);
}

train::TrainerOptions quiet_trainer(int64_t stop) {
  train::TrainerOptions q;
  q.show_progress = false;
  q.stop_at = stop;
  return q;
}

void train_on_thread_ranks(const train::TrainConfig& cfg, const dsv4::ModelConfig& model,
                           const train::Dsv4TrainOptions& opts, const data::ShardDataset& ds, int ranks,
                           const fs::path& out, int64_t stop, double timeout_s, const AfterRankRun& after) {
  auto group = comm::make_thread_group(ranks, timeout_s);
  run_ranks(group, [&](int r) {
    train::GpuMeshEngine engine(cfg, model, opts, *group[size_t(r)]);
    const train::TrainResult res = train::Trainer(cfg, out, engine, ds, 1, quiet_trainer(stop)).run();
    if (after) after(r, engine, res);
  });
}

void expect_steps_match(const fs::path& ref_dir, const fs::path& dir, const std::string& what, size_t from,
                        size_t steps, const StepBounds& b, const StepCheck& more) {
  const auto m1 = train::read_jsonl(ref_dir / "metrics.jsonl"), m2 = train::read_jsonl(dir / "metrics.jsonl");
  ASSERT_EQ(m1.size(), steps) << "the reference run " << ref_dir;
  ASSERT_EQ(m2.size(), steps) << what;
  for (size_t i = from; i < steps; ++i) {
    const double a = m1[i]["loss"].get<double>(), g = m2[i]["loss"].get<double>();
    const double ga = m1[i]["grad_norm"].get<double>(), gb = m2[i]["grad_norm"].get<double>();
    std::printf("  %s step %zu: loss one rank %.6f, %.6f; grad norm %.5f / %.5f\n", what.c_str(), i + 1, a, g, ga,
                gb);
    EXPECT_LT(std::abs(a - g) / a, b.loss_rel) << what << " step " << i + 1;
    EXPECT_LT(std::abs(ga - gb) / ga, b.grad_norm_rel) << what << " step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], m2[i]["targets"]) << what << " step " << i + 1 << ": the global batch differs";
    if (!more) continue;
    more(i, m1[i], m2[i]);
    if (::testing::Test::HasFatalFailure()) return;  // an ASSERT of `more` stops the comparison, as inline
  }
}

void expect_resumed_run_matches(const fs::path& ref_dir, const fs::path& dir, const std::string& what,
                                double loss_rel, size_t resumed_at) {
  const auto m1 = train::read_jsonl(ref_dir / "metrics.jsonl"), mr = train::read_jsonl(dir / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(mr.size(), 6u) << what;
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(mr[i]["step"], m1[i]["step"]);
    const double a = m1[i]["loss"].get<double>(), b = mr[i]["loss"].get<double>();
    std::printf("  %s step %zu: loss one rank %.6f, %s %.6f\n", what.c_str(), i + 1, a,
                i < resumed_at ? "first" : "resumed", b);
    EXPECT_LT(std::abs(a - b) / a, loss_rel) << what << " step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], mr[i]["targets"]) << what << " step " << i + 1 << ": the data position differs";
  }
}

void expect_loss_falls(const fs::path& dir, const std::string& what) {
  const auto m = train::read_jsonl(dir / "metrics.jsonl");
  ASSERT_FALSE(m.empty()) << what << ": no metrics in " << dir;
  EXPECT_LT(m.back()["loss"].get<double>(), m.front()["loss"].get<double>()) << what << ": the loss does not fall";
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return std::isfinite(m) ? m : INFINITY;
}

void copy_run(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

dsv4::ModelConfig tiny_gpu_config_layers(int64_t n, const std::string& where) {
  nlohmann::json j = tiny_gpu_config_json();
  j["num_hidden_layers"] = n;
  nlohmann::json cr = nlohmann::json::array();
  for (int64_t l = 0; l < n; ++l) cr.push_back(std::vector<int>{0, 4, 16}[size_t(l % 3)]);
  j["compress_ratios"] = cr;
  return dsv4::parse_model_config(j, where);
}

void make_global_batch(int64_t vocab, int64_t micro, int64_t seq, uint32_t seed, std::vector<int32_t>& ids,
                       std::vector<int32_t>& labels) {
  std::mt19937 g(seed);
  ids.resize(size_t(micro * seq));
  labels.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(g() % uint32_t(vocab));
    const int64_t m = int64_t(i) / seq;
    labels[i] = (int64_t(i) % (3 + m % 5) == 1) ? -100 : ids[i];
  }
}

int64_t count_targets(const std::vector<int32_t>& labels, int64_t seq) {
  int64_t targets = 0;
  for (int64_t i = 0; i + 1 < int64_t(labels.size()); ++i) targets += (i % seq != seq - 1) && labels[size_t(i + 1)] >= 0;
  return targets;
}

TwoMicroBatchStageInputs two_micro_batch_stage_inputs(const dsv4::ModelConfig& cfg, const dsv4::SeqLayout& mb,
                                                      uint32_t seed) {
  const int64_t N = mb.n_tokens(), n = N * cfg.hc_mult * cfg.hidden;
  std::mt19937 g(seed);
  TwoMicroBatchStageInputs in;
  in.ids.resize(static_cast<size_t>(2 * N));
  for (auto& t : in.ids) t = int32_t(g() % uint32_t(cfg.vocab_size));
  std::normal_distribution<float> nd(0.f, 1e-2f);
  in.dx.resize(static_cast<size_t>(2 * n));
  for (auto& v : in.dx) v = nd(g);
  return in;
}

bool is_expert_tensor(const std::string& name) { return name.find(".ffn.experts.") != std::string::npos; }

cuda::AdamWStep pipeline_adamw(int step) {
  cuda::AdamWStep a;
  a.lr = 1e-3, a.weight_decay = 0.1, a.step = step;
  return a;
}

OneRankReference one_rank_reference(const dsv4::ModelConfig& cfg, const std::vector<int32_t>& ids,
                                    const std::vector<int32_t>& labels, int64_t micro, int64_t seq, int steps) {
  OneRankReference r;
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(1, seq);
  const int64_t targets = count_targets(labels, seq);
  dsv4gpu::GpuModel one(cfg);
  dsv4gpu::GpuOptimizer opt(one);
  one.init_random(5);
  r.n_params = one.n_params();
  for (const std::string& n : one.param_names()) r.init[n] = one.value(n);
  for (int s = 1; s <= steps; ++s) {
    one.zero_grads();
    one.begin_step(targets);
    double loss = 0;
    for (int64_t m = 0; m < micro; ++m) {
      loss += one.forward_stage(m, ids.data() + m * seq, labels.data() + m * seq, mb, nullptr);
      one.backward_stage(m, nullptr);
    }
    r.losses.push_back(loss);
    if (s == 1) {
      for (const std::string& n : one.param_names()) r.grads[n] = one.grad(n);
      r.grad_norm = one.grad_norm();
    }
    opt.adamw_step(pipeline_adamw(s));
  }
  for (const std::string& n : one.param_names()) r.final[n] = one.value(n);
  return r;
}

PipelineMeshGroups::PipelineMeshGroups(int P, int D, int EP, int directions, double timeout_s) : D_(D), EP_(EP) {
  for (int s = 0; s < P; ++s) {
    dp_.push_back(comm::make_thread_group(D, timeout_s));
    for (int k = 0; k < D / EP; ++k) ep_.push_back(comm::make_thread_group(EP, timeout_s));
  }
  dir_.resize(size_t(directions));
  for (int d = 0; d < D; ++d)
    for (auto& g : dir_) g.push_back(comm::make_thread_group(P, timeout_s));
}

comm::Communicator* PipelineMeshGroups::dp(int stage, int d) const { return dp_[size_t(stage)][size_t(d)].get(); }

comm::Communicator* PipelineMeshGroups::ep(int stage, int d) const {
  if (EP_ <= 1) return nullptr;
  return ep_[size_t(stage * (D_ / EP_) + d / EP_)][size_t(d % EP_)].get();
}

comm::Communicator& PipelineMeshGroups::direction(int k, int stage, int d) const {
  return *dir_[size_t(k)][size_t(d)][size_t(stage)];
}

}  // namespace trex::testing
