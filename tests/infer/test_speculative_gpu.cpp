// Speculative decoding with the MTP layer on the CUDA engine (infer/speculative.h) and V4 checkpoints with an MTP
// layer on the GPU:
//  - the output with speculation is token-for-token the plain greedy output of the same engine weights (random
//    tiny config with an MTP layer: generate() and the scheduler, chunked prompts, sequences joining and leaving;
//    a sampled request beside greedy ones, which makes steps alternate between plain and speculative and the MTP
//    rebuild its row of the last position; the flash-l4 shapes with an MTP layer);
//  - the demo's export (a trained checkpoint with its MTP layer; bash scripts/run.sh makes demo/hf, the device
//    copy is .devdeps/demo-hf, or TREX_DEMO_MODEL names one): GPU greedy equals the CPU engine's (teacher-forced:
//    every GPU token is the CPU's argmax unless the CPU's own margin is within bf16 noise), speculation equals plain
//    greedy, and the trained MTP's drafts are accepted at a rate far above chance (a mis-wired MTP input, cache or
//    position would draft noise).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/dtype.h"
#include "core/files.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "infer/generate.h"
#include "infer/model_loader.h"
#include "infer/scheduler.h"
#include "infer/speculative.h"
#include "model/dsv4/model.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// A CPU parameter table with the MTP module (random, bf16-representable), as a checkpoint would load.
std::unique_ptr<dsv4::Model<float>> random_model(const dsv4::ModelConfig& cfg, uint32_t seed) {
  dsv4::ModelOptions o;
  o.balance_alpha = 0.0;
  o.use_mtp = true;
  auto m = std::make_unique<dsv4::Model<float>>(cfg, o);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto& pt = m->params();
  for (const auto& p : pt.entries()) {
    float* w = pt.arena_value(p);
    const std::string& n = p.name;
    float mean = 0.f, sd = 1.f / std::sqrt(float(p.shape.back()));
    if (n.find("norm.weight") != std::string::npos) mean = 1.f, sd = 0.1f;
    if (n.find("hc_") != std::string::npos) sd = n.find("_fn") != std::string::npos ? 0.05f : 0.3f;
    if (n.find("attn_sink") != std::string::npos || n.find(".ape") != std::string::npos) sd = 0.3f;
    for (int64_t i = 0; i < p.numel; ++i) w[i] = bf16_round(mean + sd * nd(g));
  }
  for (auto& [name, b] : pt.bias)
    for (float& v : b) v = 0.05f * nd(g);
  for (auto& [name, t] : pt.tid2eid)
    for (size_t v = 0; v < t.size() / size_t(cfg.topk); ++v)
      for (int64_t k = 0; k < cfg.topk; ++k)
        t[v * size_t(cfg.topk) + size_t(k)] = int32_t((v + 3 * size_t(k)) % size_t(cfg.n_routed_experts));
  return m;
}

dsv4::ModelConfig tiny_mtp_config() {
  dsv4::ModelConfig c = trex::testing::tiny_gpu_config("tiny GPU config with an MTP layer");
  c.n_mtp = 1;
  return c;
}

std::vector<std::vector<int32_t>> prompts_for(int64_t V, const std::vector<int64_t>& lengths, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::vector<int32_t>> p;
  for (int64_t n : lengths) {
    p.emplace_back();
    for (int64_t k = 0; k < n; ++k) p.back().push_back(int32_t(2 + g() % uint32_t(V - 2)));
  }
  return p;
}

infer::SpeculativeStats stats_of(infer::Engine& e) { return infer::speculative_engine(e)->speculative_stats(); }

// The plain engine's logits after prompt + prefix (teacher-forced, slot 0): the relative margin of token a over b.
double margin_after(infer::Engine& plain, const std::vector<int32_t>& prompt, const std::vector<int32_t>& prefix,
                    int32_t a, int32_t b) {
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), prefix.begin(), prefix.end());
  plain.reset(0);
  std::vector<float> logits;
  plain.forward({infer::EngineFeed{0, seq.data(), int64_t(seq.size())}}, logits);
  float scale = 0.f;
  for (float v : logits) scale = std::max(scale, std::abs(v));
  return double(logits[size_t(a)] - logits[size_t(b)]) / std::max(double(scale), 1e-9);
}

// got (speculative) must equal ref (plain greedy) token for token. On a difference, the plain engine's own margin
// at the first differing position says whether it is a bf16 near-tie (a different batch shape of the step) or an
// error of the speculation.
void expect_same_tokens(const std::vector<infer::GenerateResult>& got, const std::vector<infer::GenerateResult>& ref,
                        const std::string& what, infer::Engine* plain = nullptr,
                        const std::vector<std::vector<int32_t>>* prompts = nullptr) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << what << ": sequence " << i;
    EXPECT_EQ(got[i].finish_reason, ref[i].finish_reason) << what << ": sequence " << i;
    if (got[i].tokens == ref[i].tokens || !plain || !prompts) continue;
    size_t t = 0;
    while (t < got[i].tokens.size() && t < ref[i].tokens.size() && got[i].tokens[t] == ref[i].tokens[t]) ++t;
    if (t == got[i].tokens.size() || t == ref[i].tokens.size()) continue;
    const std::vector<int32_t> prefix(ref[i].tokens.begin(), ref[i].tokens.begin() + ptrdiff_t(t));
    std::printf("%s: sequence %zu first differs at token %zu (plain %d, speculative %d); plain margin %.2e\n",
                what.c_str(), i, t, ref[i].tokens[t], got[i].tokens[t],
                margin_after(*plain, (*prompts)[i], prefix, ref[i].tokens[t], got[i].tokens[t]));
  }
}

TEST(SpeculativeMtp, EngineRefusesSpeculationWithoutAnMtpLayer) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny GPU config");
  infer::CudaEngineOptions eo;
  eo.slots = 1, eo.max_context = 64;
  EXPECT_THROW(infer::make_cuda_engine(cfg, nullptr, eo, true), Error);
  // A table without the mtp.0.* tensors (loaded with the MTP filtered out) cannot speculate either.
  dsv4::ModelConfig mc = tiny_mtp_config();
  dsv4::ModelOptions o;
  o.use_mtp = false, o.balance_alpha = 0.0;
  dsv4::Model<float> plain(mc, o);
  try {
    infer::make_cuda_engine(mc, &plain.params(), eo, true);
    ADD_FAILURE() << "expected an error for weights without the MTP module";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mtp.0"), std::string::npos) << e.what();
  }
  // Off, the same weights serve (the MTP layer is skipped).
  EXPECT_NO_THROW(infer::make_cuda_engine(mc, &plain.params(), eo, false));
}

TEST(SpeculativeMtp, GenerateEqualsPlainGreedyOnTinyRandomModel) {
  const dsv4::ModelConfig cfg = tiny_mtp_config();
  const auto model = random_model(cfg, 7);
  infer::CudaEngineOptions eo;
  eo.slots = 4, eo.max_context = 256;
  auto plain = infer::make_cuda_engine(cfg, &model->params(), eo, false);
  auto spec = infer::make_cuda_engine(cfg, &model->params(), eo, true);
  // Lengths that wrap the window (16) and complete entries of both ratios (4, 16); prompts chunked.
  const auto prompts = prompts_for(cfg.vocab_size, {5, 37, 18, 1}, 11);
  infer::GenerateOptions go;
  go.max_new_tokens = 60;
  go.prefill_chunk = 16;
  go.stop_ids = {-1};  // no stop token: every sequence decodes 60 tokens
  const auto ref = infer::generate(*plain, prompts, go);
  const auto got = infer::generate(*spec, prompts, go);
  expect_same_tokens(got, ref, "speculative vs plain greedy", plain.get(), &prompts);
  const infer::SpeculativeStats st = stats_of(*spec);
  std::printf("tiny random MTP: %lld drafts, %lld accepted (%.3f)\n", (long long)st.drafted,
              (long long)st.accepted, st.acceptance());
  EXPECT_GT(st.drafted, 100);  // every decode step after the first verifies a draft
  // A second round on the same slots (reset: stale caches and MTP state must not leak).
  const auto prompts2 = prompts_for(cfg.vocab_size, {23, 2, 40}, 12);
  const auto ref2 = infer::generate(*plain, prompts2, go);
  expect_same_tokens(infer::generate(*spec, prompts2, go), ref2, "second round", plain.get(), &prompts2);
  // One-token prompt chunks: a chunk equal to the engine's guess is still a prompt token, never a verified step.
  go.prefill_chunk = 1;
  go.max_new_tokens = 24;
  const auto ref3 = infer::generate(*plain, prompts2, go);
  expect_same_tokens(infer::generate(*spec, prompts2, go), ref3, "one-token prompt chunks", plain.get(), &prompts2);
}

// Greedy requests through the scheduler beside a sampled one: the sampled request makes steps run plainly
// (logits), so the MTP rebuilds its last row and drafts resume afterwards; outputs equal the plain engine's.
TEST(SpeculativeMtp, SchedulerWithSampledNeighbourEqualsPlain) {
  const dsv4::ModelConfig cfg = tiny_mtp_config();
  const auto model = random_model(cfg, 9);
  infer::CudaEngineOptions eo;
  eo.slots = 4, eo.max_context = 256;
  const auto prompts = prompts_for(cfg.vocab_size, {9, 30, 3, 17}, 5);
  auto run = [&](bool speculative, infer::SpeculativeStats* st) {
    auto engine = infer::make_cuda_engine(cfg, &model->params(), eo, speculative);
    infer::SpeculativeEngine* se = infer::speculative_engine(*engine);
    infer::SchedulerOptions so;
    so.prefill_chunk = 8;
    infer::Scheduler sched(std::move(engine), so);
    std::vector<std::shared_ptr<infer::Request>> reqs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      infer::RequestSpec s;
      s.prompt = prompts[i];
      s.max_tokens = i == 1 ? 20 : 48;  // the sampled one leaves early: later steps are all greedy again
      if (i == 1) s.sampling.temperature = 0.8, s.sampling.seed = 3;
      reqs.push_back(sched.submit(std::move(s)));
    }
    std::vector<std::vector<int32_t>> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i)
      while (!reqs[i]->wait(out[i], std::chrono::milliseconds(100))) {
      }
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(reqs[i]->finish_reason(), "length") << reqs[i]->error();
    if (st) *st = se->speculative_stats();
    sched.stop();
    return out;
  };
  infer::SpeculativeStats st;
  const auto ref = run(false, nullptr);
  const auto got = run(true, &st);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], ref[i]) << "request " << i;
  std::printf("scheduler, tiny random MTP: %lld drafts, %lld accepted\n", (long long)st.drafted,
              (long long)st.accepted);
  EXPECT_GT(st.drafted, 0);
}

// The flash-l4 shapes (V4-Flash layers: head_dim 512, 64 heads, CSA m=4 with the indexer, HCA m=128, 16 experts)
// with one MTP layer, random weights on the device: serves, and speculation equals plain greedy.
TEST(SpeculativeMtp, FlashL4ShapesWithMtpLayerServeAndMatchPlain) {
  nlohmann::json j = {{"vocab_size", 129280}, {"hidden_size", 4096}, {"num_hidden_layers", 4},
                      {"num_attention_heads", 64}, {"num_key_value_heads", 1}, {"head_dim", 512},
                      {"qk_rope_head_dim", 64}, {"q_lora_rank", 1024}, {"o_groups", 8}, {"o_lora_rank", 1024},
                      {"n_routed_experts", 16}, {"num_experts_per_tok", 6}, {"n_shared_experts", 1},
                      {"moe_intermediate_size", 2048}, {"routed_scaling_factor", 1.5},
                      {"scoring_func", "sqrtsoftplus"}, {"norm_topk_prob", true}, {"swiglu_limit", 10.0},
                      {"index_n_heads", 64}, {"index_head_dim", 128}, {"index_topk", 512}, {"sliding_window", 128},
                      {"compress_ratios", {0, 0, 4, 128, 0}}, {"num_hash_layers", 3}, {"hc_mult", 4},
                      {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000},
                      {"compress_rope_theta", 160000},
                      {"rope_scaling",
                       {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                        {"beta_fast", 32}, {"beta_slow", 1}}},
                      {"max_position_embeddings", 1048576}, {"num_nextn_predict_layers", 1},
                      {"bos_token_id", 0}, {"eos_token_id", 1}};
  const dsv4::ModelConfig cfg = dsv4::parse_model_config(j, "flash-l4 with MTP");
  ASSERT_EQ(cfg.n_mtp, 1);
  infer::CudaEngineOptions eo;
  eo.slots = 2, eo.max_context = 512, eo.seed = 3;
  const auto prompts = prompts_for(cfg.vocab_size, {300, 140}, 21);  // past the window and 2 HCA entries
  infer::GenerateOptions go;
  go.max_new_tokens = 48;
  go.stop_ids = {-1};
  std::vector<infer::GenerateResult> ref, got;
  infer::SpeculativeStats st;
  {
    auto spec = infer::make_cuda_engine(cfg, nullptr, eo, true);
    got = infer::generate(*spec, prompts, go);
    st = stats_of(*spec);
  }
  auto plain = infer::make_cuda_engine(cfg, nullptr, eo, false);
  ref = infer::generate(*plain, prompts, go);
  expect_same_tokens(got, ref, "flash-l4 + MTP: speculative vs plain greedy", plain.get(), &prompts);
  std::printf("flash-l4 random MTP: %lld drafts, %lld accepted\n", (long long)st.drafted, (long long)st.accepted);
  EXPECT_GT(st.drafted, 40);
}

std::filesystem::path demo_model() {
  if (const char* e = std::getenv("TREX_DEMO_MODEL")) return e;
  for (const auto& p : {source_dir() / ".devdeps" / "demo-hf", source_dir() / "demo" / "hf"})
    if (std::filesystem::exists(p / "config.json")) return p;
  return {};
}

TEST(SpeculativeMtp, DemoExportServesOnGpuLikeCpuAndSpeculationMatches) {
  const std::filesystem::path dir = demo_model();
  if (dir.empty())
    GTEST_SKIP() << "needs the demo's export (bash scripts/run.sh makes demo/hf; or .devdeps/demo-hf, "
                    "TREX_DEMO_MODEL)";
  const auto model = infer::load_inference_model(dir, /*with_mtp=*/true);
  const dsv4::ModelConfig& cfg = model->config();
  ASSERT_EQ(cfg.n_mtp, 1) << "the demo export has no MTP layer";
  // CPU reference engine (fp32, no MTP).
  std::shared_ptr<dsv4::Model<float>> cpu_model = infer::load_inference_model(dir, false);
  auto cpu = infer::make_cpu_engine(cpu_model, 3, 512);
  infer::CudaEngineOptions eo;
  eo.slots = 3, eo.max_context = 512;
  auto gpu = infer::make_cuda_engine(cfg, &model->params(), eo, false);
  auto spec = infer::make_cuda_engine(cfg, &model->params(), eo, true);
  // Two chat prompts of the kind the demo was trained on (its tokenizer), and random ids.
  std::vector<std::vector<int32_t>> prompts;
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    const data::Tokenizer tok = data::Tokenizer::load((dir / "tokenizer.json").string());
    for (const char* q : {"A factory makes chairs and tables. Each chair earns 30 and needs 2 hours of work; each "
                          "table earns 50 and needs 4 hours. 100 hours are available. Maximize the profit.",
                          "Minimize the cost of a diet: bread costs 2 per unit, milk 3 per unit; at least 8 units "
                          "of protein are needed."})
      prompts.push_back(data::encode_prompt(tok, {data::ChatMessage{"user", q, ""}}, false));
  }
  prompts.push_back(prompts_for(cfg.vocab_size, {12}, 33)[0]);
  infer::GenerateOptions go;
  go.max_new_tokens = 80;
  go.stop_ids = {-1};
  const auto g = infer::generate(*gpu, prompts, go);
  // Teacher-forced CPU check of every GPU token.
  int64_t checked = 0, ties = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    cpu->reset(0);
    std::vector<int32_t> seq = prompts[i];
    std::vector<float> logits;
    std::vector<infer::EngineFeed> f{{0, seq.data(), int64_t(seq.size())}};
    cpu->forward(f, logits);
    for (size_t t = 0; t < g[i].tokens.size(); ++t) {
      const int32_t got = g[i].tokens[t];
      const float* row = logits.data();
      int32_t best = 0;
      float scale = 0.f;
      for (int64_t v = 0; v < cfg.vocab_size; ++v) {
        if (row[v] > row[best]) best = int32_t(v);
        scale = std::max(scale, std::abs(row[v]));
      }
      if (got != best) {
        const double margin = double(row[best] - row[got]) / std::max(double(scale), 1e-9);
        EXPECT_LT(margin, 0.03) << "sequence " << i << " token " << t << ": GPU " << got << ", CPU " << best;
        ++ties;
      }
      ++checked;
      std::vector<infer::EngineFeed> f1{{0, &g[i].tokens[t], 1}};
      cpu->forward(f1, logits);
    }
  }
  std::printf("demo export: %lld GPU greedy tokens checked against the CPU engine, %lld within bf16 near-ties\n",
              (long long)checked, (long long)ties);
  // And the free-running greedy outputs themselves, while no near-tie made them diverge.
  const auto c = infer::generate(*cpu, prompts, go);
  int64_t same = 0;
  for (size_t i = 0; i < prompts.size(); ++i) same += c[i].tokens == g[i].tokens;
  std::printf("demo export: %lld of %zu sequences identical to the CPU engine's greedy output\n", (long long)same,
              prompts.size());
  if (ties == 0) {
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(g[i].tokens, c[i].tokens) << "sequence " << i;
  }
  // Speculation: identical to plain greedy; the trained MTP's drafts are mostly right.
  const auto s = infer::generate(*spec, prompts, go);
  expect_same_tokens(s, g, "demo export: speculative vs plain greedy", gpu.get(), &prompts);
  const infer::SpeculativeStats st = stats_of(*spec);
  std::printf("demo export: %lld drafts, %lld accepted (acceptance %.3f)\n", (long long)st.drafted,
              (long long)st.accepted, st.acceptance());
  EXPECT_GT(st.drafted, 100);
  EXPECT_GT(st.acceptance(), 0.1) << "a trained MTP module drafts far better than chance (1/" << cfg.vocab_size
                                  << ")";
}

}  // namespace
